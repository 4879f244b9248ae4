/* stop.h - incremental stop-string matcher over streamed text. */
#ifndef RKV_STOP_H
#define RKV_STOP_H

#include <stddef.h>

#define STOP_MAX_STRINGS 8
#define STOP_MAX_LEN     256

/* the text is fed in chunks (detokenized pieces); the matcher hands back what
 * can be sent to the client now and holds back a tail that could still turn
 * into a stop string, plus an incomplete UTF-8 sequence at the very end, so
 * what it hands out never ends inside a character (when the text is valid
 * UTF-8) and never contains a stop string.
 *
 * match rule (the same for every chunking): the first stop string to end in
 * the text wins; when several end at the same byte, the longest. the result
 * is the text before it. matching is on bytes, so a UTF-8 stop string only
 * matches whole characters of valid UTF-8 text. */
struct stop;

/* strs: n (0..STOP_MAX_STRINGS) strings of 1..STOP_MAX_LEN bytes, copied.
 * errors: RKV_ETOOBIG (too many / too long), RKV_EINVAL (empty string),
 * RKV_ENOMEM. */
int stop_create(struct stop **out, const char *const *strs, size_t n);
void stop_destroy(struct stop *s);

/* feeds the next chunk. emit, emit_len: the text now safe to send (may be
 * empty; valid until the next call). returns 0 while no stop string has
 * matched, 1 when one matched (emit then ends right before it; further
 * feeds emit nothing and return 1), or a negative RKV_E* code. */
int stop_feed(struct stop *s, const char *chunk, size_t len, const char **emit, size_t *emit_len);
/* end of the stream: emits the held-back tail (nothing after a match) */
void stop_flush(struct stop *s, const char **emit, size_t *emit_len);
/* index of the matched stop string, or -1 */
int stop_matched(const struct stop *s);
/* bytes held back right now */
size_t stop_held(const struct stop *s);

#endif
