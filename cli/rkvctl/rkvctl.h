/* rkvctl.h - what rkvctl's files share: exit codes and the help topics. */
#ifndef RKV_RKVCTL_H
#define RKV_RKVCTL_H

#include <stdio.h>

enum rkvctl_exit {
    RKVCTL_OK = 0,
    RKVCTL_USAGE = 1,
    RKVCTL_UNREACHABLE = 2,
    RKVCTL_REFUSED = 3,
};

/* prints topic (NULL: the overview and the topic list) to f; -1 when unknown */
int rkvctl_help(const char *topic, FILE *f);

#endif
