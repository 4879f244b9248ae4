/* grammar.h - GBNF grammars, a vocabulary's tokens, per-sequence matchers, token masks. */
#ifndef RKV_GRAMMAR_H
#define RKV_GRAMMAR_H

#include <stddef.h>
#include <stdint.h>

/* the algorithm
 * a grammar compiles to rules over BYTES: a literal is a sequence of byte
 * sets, a character class over code points becomes alternatives of UTF-8
 * byte-range sequences, `x*` `x+` `x?` `x{m,n}` become small helper rules
 * (right-recursive, so a repetition never deepens a stack). a matcher keeps
 * the set of llama.cpp-style parse stacks that the bytes so far allow; the
 * stacks are hash-consed cons lists (equal stacks are one id, shared tails
 * are stored once) and a stack set is itself interned, so a set of stacks
 * is one id and stepping a set by one byte is memoized (a lazily built
 * DFA, as RE2 does). a token is allowed iff all its bytes can be consumed
 * from the current set; a mask walks the vocabulary as a trie, so shared
 * prefixes are stepped once and a dead prefix prunes its whole subtree,
 * and masks are cached by set id (inside a JSON string the set repeats
 * after every character, so the mask is computed once per string).
 *
 * limits
 * - left recursion (`a ::= a "x"`, also through nullable prefixes) is
 *   refused at compile time with the cycle named.
 * - ambiguity costs: the set holds every parse at once; a grammar with k
 *   ways to parse a prefix keeps k stacks. the JSON grammars
 *   json_schema_to_gbnf emits are unambiguous, so their sets stay small.
 * - the memo tables and interned stacks are bounded: past
 *   GRAMMAR_CACHE_BYTES a matcher drops them and re-interns its current
 *   stacks (correctness never depends on the caches).
 * - an expansion (one byte's step from a set) visits at most GRAMMAR_MAX_EXPAND
 *   stacks: an ambiguous grammar whose parses multiply (nested repetitions
 *   such as ((a+)+)+, in GBNF or a schema's pattern) keeps the parses found
 *   first, so its matcher accepts less than the grammar but never more, and
 *   its time per byte stays bounded.
 * - a stack deeper than GRAMMAR_MAX_DEPTH (recursive grammars nested that
 *   deep) is dropped; a repetition count above GRAMMAR_MAX_REPEAT, or a
 *   grammar of more than GRAMMAR_MAX_ELEMS elements, or ( ) nested deeper than
 *   GRAMMAR_MAX_NESTING, is a compile error.
 * - masks are also shared by every matcher of a grammar (and vocab): a cache in the grammar,
 *   behind a mutex, keyed by the top 3 frames of each stack, holds the tokens allowed
 *   whatever lies below them; each matcher tries only the tokens that reach below from its
 *   own state. so a batch of sequences of one schema walks the trie once per state. */
#define GRAMMAR_MAX_DEPTH   4096
#define GRAMMAR_MAX_EXPAND  4096
#define GRAMMAR_MAX_REPEAT  10000
#define GRAMMAR_MAX_ELEMS   (1u << 22)
#define GRAMMAR_CACHE_BYTES (16u << 20)
#define GRAMMAR_MAX_NESTING 256

struct tok;

struct grammar;         /* compiled, shareable across threads (its mask cache is locked) */
struct grammar_vocab;   /* a vocabulary's token bytes as a trie, immutable, shareable */
struct grammar_matcher; /* one sequence's parse state; not thread-safe */

/* GBNF as llama.cpp writes it: `name ::= alternatives`, "literals" with
 * \n \r \t \\ \" \xHH \uHHHH \UHHHHHHHH escapes, [classes] ([^...] negated,
 * ranges, escapes), `.` (any character), ( groups ), `|`, `*` `+` `?`,
 * `{m}` `{m,}` `{m,n}`, `# comments`. the start rule is "root". errors
 * name line and column: "line 3, column 14: expected ::= after rule name". */
int grammar_compile(const char *gbnf, size_t len, struct grammar **out, char *err, size_t errlen);
void grammar_destroy(struct grammar *g);

/* token i stands for bytes[i] (lens[i] bytes; 0 bytes = a control token,
 * never allowed), eog[i] 1 for end-of-generation tokens (allowed exactly
 * when the grammar can end here). eog may be NULL (no eog token). */
int grammar_vocab_create(struct grammar_vocab **out, int32_t n_vocab, const char *const *bytes,
                         const uint32_t *lens, const uint8_t *eog);
/* the same from a tokenizer (tok_token_bytes(render_special=0), tok_is_eog,
 * tok_is_control: a control token that is not eog gets 0 bytes) */
int grammar_vocab_from_tok(struct grammar_vocab **out, const struct tok *t);
void grammar_vocab_destroy(struct grammar_vocab *v);
int32_t grammar_vocab_n(const struct grammar_vocab *v);

/* g and v must outlive the matcher */
int grammar_matcher_create(struct grammar_matcher **out, const struct grammar *g,
                           const struct grammar_vocab *v);
void grammar_matcher_destroy(struct grammar_matcher *m);
/* the tokens allowed next: bit (id & 31) of mask[id >> 5] set = allowed;
 * (n_vocab + 31) / 32 words. never empty while the sequence is not
 * finished: at worst the eog tokens (also when the grammar cannot end but
 * no token of the vocabulary continues it: the sequence then ends short
 * of the grammar). after an eog token was accepted: all zero. */
int grammar_matcher_mask(struct grammar_matcher *m, uint32_t *mask);
/* advances by token id; RKV_EINVAL (state unchanged) when id is not allowed.
 * an eog token finishes the sequence. */
int grammar_matcher_accept(struct grammar_matcher *m, int32_t id);
/* advances by raw bytes (a prompt's forced prefix, tests); RKV_EINVAL
 * (state unchanged) when the bytes do not continue the grammar */
int grammar_matcher_accept_bytes(struct grammar_matcher *m, const char *bytes, size_t len);
/* 1 when the text so far is a complete sentence of the grammar (an eog token may follow) */
int grammar_matcher_can_end(const struct grammar_matcher *m);
/* 1 when nothing but an eog token can follow (the grammar is complete and cannot extend) */
int grammar_matcher_must_end(const struct grammar_matcher *m);
/* back to the start of the grammar (reuses the caches) */
void grammar_matcher_reset(struct grammar_matcher *m);

#endif
