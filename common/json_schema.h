/* json_schema.h - JSON Schema (the subset docs/structured-output.md lists) -> GBNF text. */
#ifndef RKV_JSON_SCHEMA_H
#define RKV_JSON_SCHEMA_H

#include <stddef.h>

/* schema: JSON text. on success *gbnf is malloc'd NUL-terminated GBNF whose root rule is "root",
 * checked by grammar_compile. an unsupported keyword, a bad type, an unresolvable $ref:
 * RKV_EUNSUPPORTED / RKV_EINVAL with err naming the JSON pointer and the keyword, e.g.
 *   "schema/properties/tags: keyword \"patternProperties\" is not supported (supported: ...)"
 * malformed JSON: RKV_EFORMAT. what the grammar generates:
 * - JSON with bounded whitespace: between tokens nothing, one space, or one newline and up
 *   to 20 spaces or tabs; none before the value or after it (the text ends with the value).
 * - object properties in schema order; optional ones may be left out. additionalProperties
 *   absent or false: no other properties (strict); true or a schema: other keys, none equal
 *   to a declared one, after the declared ones.
 * - numbers: at most 16 integer digits, 16 fraction digits, 3 exponent digits. */
int json_schema_to_gbnf(const char *schema, size_t len, char **gbnf, char *err, size_t errlen);
/* the same, framed: the text is prefix, then the schema's JSON, then suffix (a tool call's
 * markup around its JSON object); NULL is "" */
int json_schema_to_gbnf_framed(const char *schema, size_t len, const char *prefix,
                               const char *suffix, char **gbnf, char *err, size_t errlen);
/* GBNF of any JSON object (json_object mode); static text */
const char *json_schema_any_object_gbnf(void);

#endif
