"""Structured output's engine end to end: schemas compiled to GBNF, random constrained
generations over a real vocabulary (rkv-grammar), every output parsed and validated with the
jsonschema package; GBNF grammars checked against equivalent regular expressions."""
import json
import re
import subprocess
from pathlib import Path

import pytest

from conftest import TOP, make_tiny_model, rkv_bin

jsonschema = pytest.importorskip("jsonschema")

GEMMA = TOP / "build" / "models" / "gemma-3-270m-q4_k_m.gguf"
SAMPLES = 10

SCHEMAS = {
    "person": {
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 20},
            "age": {"type": "integer", "minimum": 0, "maximum": 130},
            "tags": {"type": "array", "items": {"enum": ["a", "b", "c d"]}, "maxItems": 4},
            "email": {"type": "string", "format": "email"},
            "ok": {"type": "boolean"},
        },
        "required": ["name", "age"],
    },
    "nested": {
        "type": "object",
        "properties": {
            "id": {"type": "integer"},
            "address": {
                "type": "object",
                "properties": {
                    "street": {"type": "string", "maxLength": 12},
                    "zip": {"type": "string", "pattern": "^[0-9]{5}$"},
                    "geo": {
                        "type": "object",
                        "properties": {"lat": {"type": "number", "minimum": -90, "maximum": 90},
                                       "lon": {"type": "number", "minimum": -180,
                                               "maximum": 180}},
                        "required": ["lat", "lon"],
                    },
                },
                "required": ["street", "zip", "geo"],
            },
        },
        "required": ["id", "address"],
    },
    "array_of_objects": {
        "type": "array",
        "items": {
            "type": "object",
            "properties": {"k": {"type": "string", "maxLength": 6}, "v": {"type": "integer"}},
            "required": ["k", "v"],
        },
        "minItems": 2,
        "maxItems": 4,
    },
    "enum_mixed": {"enum": [1, "two", None, True, {"x": [1, 2]}, 3.5]},
    "const": {"type": "object", "properties": {"kind": {"const": "point"},
                                               "v": {"const": [1, "a", None]}},
              "required": ["kind", "v"]},
    "any_of": {"type": "object",
               "properties": {"value": {"anyOf": [{"type": "string", "maxLength": 8},
                                                  {"type": "integer"},
                                                  {"type": "array",
                                                   "items": {"type": "boolean"},
                                                   "maxItems": 3}]}},
               "required": ["value"]},
    "one_of_disjoint": {"oneOf": [
        {"type": "object", "properties": {"cat": {"const": "meow"}}, "required": ["cat"]},
        {"type": "object", "properties": {"dog": {"type": "integer", "minimum": 1,
                                                  "maximum": 9}},
         "required": ["dog"]}]},
    "ref_tree": {
        "$defs": {"node": {"type": "object",
                           "properties": {"v": {"type": "integer", "minimum": 0,
                                                "maximum": 99},
                                          "kids": {"type": "array",
                                                   "items": {"$ref": "#/$defs/node"},
                                                   "maxItems": 2}},
                           "required": ["v"]}},
        "$ref": "#/$defs/node",
    },
    "ref_definitions_list": {
        "definitions": {"cell": {"type": "object",
                                 "properties": {"head": {"type": "string", "maxLength": 4},
                                                "tail": {"anyOf": [{"$ref": "#/definitions/cell"},
                                                                   {"type": "null"}]}},
                                 "required": ["head", "tail"]}},
        "$ref": "#/definitions/cell",
    },
    "pattern_anchored": {"type": "object",
                         "properties": {"code": {"type": "string",
                                                 "pattern": "^[A-Z]{3}-[0-9]{2,4}$"},
                                        "word": {"type": "string",
                                                 "pattern": "^(foo|bar)(-[a-z]+){0,2}$"}},
                         "required": ["code", "word"]},
    "pattern_unanchored": {"type": "array",
                           "items": {"type": "string", "pattern": "ab+c"},
                           "minItems": 1, "maxItems": 3},
    "pattern_classes": {"type": "string",
                        "pattern": "^\\w+@[a-z\\d]+\\.(com|org)\\s?[^a-z\"]{0,3}\\.?$"},
    "formats": {"type": "object",
                "properties": {"d": {"type": "string", "format": "date"},
                               "dt": {"type": "string", "format": "date-time"},
                               "t": {"type": "string", "format": "time"},
                               "u": {"type": "string", "format": "uuid"}},
                "required": ["d", "dt", "t", "u"]},
    "integer_ranges": {"type": "object",
                       "properties": {"neg": {"type": "integer", "minimum": -50,
                                              "maximum": -3},
                                      "mid": {"type": "integer", "minimum": -1000,
                                              "maximum": 1000},
                                      "excl": {"type": "integer", "exclusiveMinimum": 7,
                                               "exclusiveMaximum": 12},
                                      "big": {"type": "integer", "minimum": 1000000,
                                              "maximum": 1000000000000},
                                      "low": {"type": "integer", "minimum": 17}},
                       "required": ["neg", "mid", "excl", "big", "low"]},
    "number_bounds": {"type": "array",
                      "items": {"type": "number", "minimum": -5, "maximum": 5},
                      "minItems": 3, "maxItems": 6},
    "tuple": {"type": "array",
              "prefixItems": [{"type": "string", "maxLength": 5}, {"type": "integer"},
                              {"type": "boolean"}],
              "items": False, "minItems": 2},
    "tuple_then_items": {"type": "array", "prefixItems": [{"const": "head"}],
                         "items": {"type": "integer", "minimum": 0, "maximum": 9},
                         "maxItems": 5},
    "type_list": {"type": "object",
                  "properties": {"maybe": {"type": ["string", "null"], "maxLength": 5},
                                 "num": {"type": ["integer", "boolean"]}},
                  "required": ["maybe", "num"]},
    "additional_schema": {"type": "object",
                          "properties": {"fixed": {"type": "boolean"}},
                          "required": ["fixed"],
                          "additionalProperties": {"type": "integer", "minimum": 0,
                                                   "maximum": 9}},
    "additional_true": {"type": "object", "properties": {"id": {"type": "integer"}},
                        "additionalProperties": True},
    "all_of_merge": {"allOf": [
        {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]},
        {"properties": {"b": {"type": "string", "maxLength": 3}}, "required": ["b"]},
    ]},
    "string_lengths": {"type": "array",
                       "items": {"type": "string", "minLength": 2, "maxLength": 5},
                       "minItems": 1, "maxItems": 3},
    "all_optional": {"type": "object",
                     "properties": {"p": {"type": "integer"}, "q": {"type": "null"},
                                    "r": {"type": "boolean"}}},
    "nested_arrays": {"type": "array",
                      "items": {"type": "array", "items": {"type": "number"}, "maxItems": 3},
                      "maxItems": 3},
    "unicode": {"type": "object",
                "properties": {"café": {"enum": ["crème", "日本", "a\"b\\c"]},
                               "ключ": {"type": "string", "pattern": "^[а-я]{2,4}$"}},
                "required": ["café", "ключ"]},
    "escapes_in_pattern": {"type": "string", "pattern": "^a\"b\\\\c\\n[\"\\\\]$"},
    "any_object": {"type": "object"},
    "description_ignored": {"title": "T", "description": "d", "type": "object",
                            "properties": {"x": {"type": "integer", "default": 3,
                                                 "examples": [1]}},
                            "required": ["x"], "$schema":
                                "https://json-schema.org/draft/2020-12/schema"},
}


@pytest.fixture(scope="module")
def vocabs(tmp_path_factory):
    out = [make_tiny_model(tmp_path_factory.mktemp("model") / "tiny.gguf")]
    if GEMMA.exists():
        out.append(GEMMA)
    return out


def generate(model, tmp_path, seed, schema=None, gbnf=None, samples=SAMPLES, extra=()):
    args = [rkv_bin("rkv-grammar"), "--model", str(model), "--samples", str(samples),
            "--seed", str(seed), *extra]
    if schema is not None:
        p = tmp_path / "schema.json"
        p.write_text(json.dumps(schema))
        args += ["--schema", str(p)]
    else:
        p = tmp_path / "grammar.gbnf"
        p.write_text(gbnf)
        args += ["--gbnf", str(p)]
    r = subprocess.run(args, capture_output=True, timeout=300)
    assert r.returncode == 0, r.stderr.decode(errors="replace")
    recs = [json.loads(line) for line in r.stdout.decode().splitlines()]
    assert len(recs) == samples
    return recs


@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_schema_outputs_validate(name, vocabs, tmp_path):
    schema = SCHEMAS[name]
    cls = jsonschema.validators.validator_for(schema)
    validator = cls(schema, format_checker=cls.FORMAT_CHECKER)
    for vi, model in enumerate(vocabs):
        for rec in generate(model, tmp_path, seed=7 + vi, schema=schema):
            text = rec["text"]
            assert rec["end"] in ("eog", "complete"), (model.name, rec)
            value = json.loads(text)
            errors = [e.message for e in validator.iter_errors(value)]
            assert not errors, (model.name, text, errors)
            # bounded whitespace: never more than one newline and 20 blanks in a row
            assert not re.search(r"\s{23,}", text), text
            assert text == text.strip(), text


def test_outputs_vary(vocabs, tmp_path):
    """the sampler really explores: different samples, different property subsets"""
    recs = generate(vocabs[0], tmp_path, seed=3, schema=SCHEMAS["all_optional"], samples=30)
    keys = {tuple(json.loads(r["text"]).keys()) for r in recs}
    assert len(keys) >= 4, keys
    assert len({r["text"] for r in recs}) >= 20


def test_json_object_mode(vocabs, tmp_path):
    for model in vocabs:
        r = subprocess.run([rkv_bin("rkv-grammar"), "--json-object", "--model", str(model),
                            "--samples", "10", "--seed", "5"], capture_output=True, timeout=300)
        assert r.returncode == 0, r.stderr.decode(errors="replace")
        for line in r.stdout.decode().splitlines():
            rec = json.loads(line)
            assert isinstance(json.loads(rec["text"]), dict), rec


GRAMMARS = [
    # (gbnf, an equivalent regular expression)
    ('root ::= ("yes" | "no") "!"?', r'(yes|no)!?'),
    ('root ::= [a-z]{2,5} ("," [a-z]{2,5}){0,3}', r'[a-z]{2,5}(,[a-z]{2,5}){0,3}'),
    ('root ::= expr\n'
     'expr ::= term (("+" | "-") term){0,3}\n'
     'term ::= [0-9]{1,3} | "(" [0-9]{1,3} ("*" [0-9]{1,3})? ")"',
     r'(\d{1,3}|\(\d{1,3}(\*\d{1,3})?\))([+-](\d{1,3}|\(\d{1,3}(\*\d{1,3})?\))){0,3}'),
    ('root ::= "<" [^<>]{0,8} ">"  # utf-8 inside\n', r'<[^<>]{0,8}>'),
]


@pytest.mark.parametrize("i", range(len(GRAMMARS)))
def test_gbnf_outputs_match(i, vocabs, tmp_path):
    gbnf, rx = GRAMMARS[i]
    for model in vocabs:
        for rec in generate(model, tmp_path, seed=11, gbnf=gbnf):
            assert rec["end"] in ("eog", "complete"), rec
            assert re.fullmatch(rx, rec["text"], re.S), (model.name, rec)


@pytest.mark.parametrize("schema,want", [
    ({"type": "object", "properties": {"tags": {"patternProperties": {}}}},
     'schema/properties/tags: keyword "patternProperties" is not supported (supported: type,'),
    ({"type": "strung"}, 'schema: keyword "type": "strung" is not a type'),
    ({"$ref": "#/$defs/missing"}, 'schema: $ref "#/$defs/missing" does not resolve'),
    ({"type": "string", "format": "hostname"},
     'schema: keyword "format": "hostname" is not supported'),
    ({"type": "string", "pattern": "^a(?=b)$"},
     'schema: keyword "pattern": a lookaround or named group at offset 2'),
    ({"type": "array", "items": {"type": "integer", "multipleOf": 3}},
     'schema/items: keyword "multipleOf" is not supported'),
    ({"$defs": {"a": {"anyOf": [{"$ref": "#/$defs/a"}, {"type": "null"}]}},
      "$ref": "#/$defs/a"}, "left recursion"),
])
def test_schema_errors(schema, want, tmp_path):
    p = tmp_path / "schema.json"
    p.write_text(json.dumps(schema))
    r = subprocess.run([rkv_bin("rkv-grammar"), "--schema", str(p), "--print-gbnf"],
                       capture_output=True, timeout=60)
    assert r.returncode == 1
    assert want in r.stderr.decode(), r.stderr.decode()


def test_bench_reports_mask_times(vocabs, tmp_path):
    p = tmp_path / "schema.json"
    p.write_text(json.dumps(SCHEMAS["person"]))
    r = subprocess.run([rkv_bin("rkv-grammar"), "--schema", str(p), "--model", str(vocabs[-1]),
                        "--samples", "3", "--bench"], capture_output=True, timeout=300)
    assert r.returncode == 0, r.stderr.decode(errors="replace")
    bench = [json.loads(line) for line in r.stderr.decode().splitlines()
             if line.startswith("{")]
    assert len(bench) == 1 and bench[0]["masks"] > 10
    assert 0 < bench[0]["mask_median_us"] <= bench[0]["mask_p99_us"] <= bench[0]["mask_max_us"]
