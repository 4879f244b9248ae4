/* corpus.h - built-in training text for rkv-mkmodel's tokenizer. */
#ifndef RKV_MKMODEL_CORPUS_H
#define RKV_MKMODEL_CORPUS_H

#include <stddef.h>

const char *mk_corpus(size_t *len);

#endif
