"""Chats render with the model's own Jinja template: a GGUF whose template differs from its
family's renders with the file's (as Python jinja2 renders it, BOS once), --chat-template FILE
replaces it, a template's raise_exception comes back as a 400 naming its message, and a
template file that does not parse stops rkvd at start, naming the line and column."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import Rkvd, _stop_checked, rkv_bin

jinja2 = pytest.importorskip("jinja2")
pytest.importorskip("gguf")

# llama 3's shape, with a system preamble the family renderer does not write
CUSTOM = (
    "{{ bos_token }}{% if messages[0]['role'] != 'system' %}"
    "{{ '<|start_header_id|>system<|end_header_id|>\\n\\nYou answer in one word.<|eot_id|>' }}"
    "{% endif %}{% for m in messages %}"
    "{{ '<|start_header_id|>' + m['role'] + '<|end_header_id|>\\n\\n' + m['content'] | trim"
    " + '<|eot_id|>' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}"
    "{% endif %}")

# refuses a system message, as some models' templates do
NO_SYSTEM = (
    "{% for m in messages %}{% if m['role'] == 'system' %}"
    "{{ raise_exception('System role not supported') }}{% endif %}"
    "{% if loop.first %}{{ bos_token }}{% endif %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}[assistant] {% endif %}")

MSGS = [{"role": "user", "content": " What is the capital of France? "}]


def jinja_render(tmpl, messages, bos, eos):
    """the text HF transformers renders (its sandboxed environment and helpers)"""
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(msg):
        raise jinja2.exceptions.TemplateError(msg)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = raise_exception
    return env.from_string(tmpl).render(messages=messages, add_generation_prompt=True,
                                        bos_token=bos, eos_token=eos)


def tok(model, *args, data=None):
    r = subprocess.run([rkv_bin("rkv-tok"), "--model", str(model), *args], input=data,
                       capture_output=True, timeout=60)
    assert r.returncode == 0, r.stderr.decode(errors="replace")
    return r.stdout


def special_texts(model):
    info = json.loads(tok(model, "--info"))
    bos = tok(model, "--decode", str(info["bos"]), "--special").decode()
    eos = tok(model, "--decode", str(info["eos"]), "--special").decode()
    return bos, eos


def chat_ids(model, messages, *extra):
    """ids of the prompt rkvd sends: rkv-tok --chat's text, tokenized with BOS and specials"""
    text = tok(model, "--chat", "/dev/stdin", "--gen", *extra, data=json.dumps(messages).encode())
    return json.loads(tok(model, "--file", "-", "--bos", "--special", data=text))


def chat(srv, messages):
    st, _, body = srv.request("POST", "/v1/chat/completions",
                              {"model": Path(srv.model).stem, "messages": messages,
                               "max_tokens": 1,
                               "temperature": 0})
    return st, json.loads(body)


@pytest.fixture(scope="module")
def custom_model(tiny_model, tmp_path_factory):
    out = tmp_path_factory.mktemp("custom") / "custom.gguf"
    r = subprocess.run([sys.executable, "-m", "gguf.scripts.gguf_new_metadata", str(tiny_model),
                        str(out), "--chat-template", CUSTOM, "--force"],
                       capture_output=True, timeout=120)
    assert r.returncode == 0, r.stderr.decode(errors="replace")
    return out


def test_file_template_renders_as_jinja2(custom_model, tiny_model):
    bos, eos = special_texts(custom_model)
    want = json.loads(tok(custom_model, "--file", "-", "--special",
                          data=jinja_render(CUSTOM, MSGS, bos, eos).encode()))
    got = chat_ids(custom_model, MSGS)
    assert got == want
    # BOS once: the template writes it and the model adds it, rkv keeps one
    info = json.loads(tok(custom_model, "--info"))
    assert got.count(info["bos"]) == 1 and got[0] == info["bos"]
    # the family renderer would have left the preamble out
    assert len(got) > len(chat_ids(tiny_model, MSGS))


def test_chat_endpoint_uses_the_file_template(custom_model, tmp_path_factory):
    srv = Rkvd(custom_model, tmp_path_factory.mktemp("tmpl")).start()
    try:
        st, r = chat(srv, MSGS)
        assert st == 200, r
        assert r["usage"]["prompt_tokens"] == len(chat_ids(custom_model, MSGS))
    finally:
        _stop_checked(srv)


def test_chat_template_flag_overrides_and_raise_exception_is_400(rkvd_factory, tiny_model,
                                                                  tmp_path):
    path = tmp_path / "no_system.jinja"
    path.write_text(NO_SYSTEM)
    srv = rkvd_factory("--chat-template", str(path))
    bos, eos = special_texts(tiny_model)
    want = json.loads(tok(tiny_model, "--file", "-", "--special",
                          data=jinja_render(NO_SYSTEM, MSGS, bos, eos).encode()))
    assert chat_ids(tiny_model, MSGS, "--chat-template", str(path)) == want
    st, r = chat(srv, MSGS)
    assert st == 200, r
    assert r["usage"]["prompt_tokens"] == len(want)

    st, r = chat(srv, [{"role": "system", "content": "Be brief."}, *MSGS])
    assert st == 400, r
    assert "System role not supported" in r["error"]["message"], r
    # the server goes on serving
    st, r = chat(srv, MSGS)
    assert st == 200, r


def test_template_file_that_does_not_parse_stops_the_start(tiny_model, tmp_path):
    path = tmp_path / "bad.jinja"
    path.write_text("{% for m in messages %}\n{{ m['content'] | frobnicate }}{% endfor %}")
    r = subprocess.run([rkv_bin("rkvd"), "--model", str(tiny_model), "--chat-template",
                        str(path), "--backend", "cpu", "--listen", "127.0.0.1:0",
                        "--state-dir", str(tmp_path / "state"),
                        "--runtime-dir", str(tmp_path / "run")],
                       capture_output=True, timeout=60)
    assert r.returncode != 0
    err = r.stderr.decode(errors="replace") + r.stdout.decode(errors="replace")
    assert f"{path} line 2, column" in err, err
    assert "frobnicate" in err, err


def test_rkv_tok_names_a_template_error(tiny_model, tmp_path):
    path = tmp_path / "no_system.jinja"
    path.write_text(NO_SYSTEM)
    r = subprocess.run([rkv_bin("rkv-tok"), "--model", str(tiny_model), "--chat", "/dev/stdin",
                        "--chat-template", str(path)],
                       input=json.dumps([{"role": "system", "content": "x"}]).encode(),
                       capture_output=True, timeout=60)
    assert r.returncode == 1
    assert "System role not supported" in r.stderr.decode(errors="replace")


@pytest.fixture(scope="module")
def phi3_model(tmp_path_factory):
    out = tmp_path_factory.mktemp("phi3") / "phi3-tiny.gguf"
    r = subprocess.run([rkv_bin("rkv-mkmodel"), "--out", str(out), "--preset", "phi3-tiny",
                        "--seed", "3"], capture_output=True, timeout=120)
    assert r.returncode == 0, r.stderr.decode(errors="replace")
    return out


def test_phi3_template_renders_as_jinja2_and_serves(phi3_model, tmp_path_factory):
    """Phi-3's template (system, user, assistant turns closed by <|end|>) renders as jinja2
    does, <|end|> is the end of a turn, and a chat through rkvd prompts with those ids"""
    msgs = [{"role": "system", "content": "Be brief."}, *MSGS,
            {"role": "assistant", "content": "Paris."}, {"role": "user", "content": "And Italy?"}]
    bos, eos = special_texts(phi3_model)
    from gguf import GGUFReader
    f = GGUFReader(str(phi3_model)).fields["tokenizer.chat_template"]
    tmpl = bytes(f.parts[f.data[0]]).decode()
    text = jinja_render(tmpl, msgs, bos, eos)
    assert text.endswith("<|end|>\n<|assistant|>\n") and text.startswith("<|system|>\n")
    want = json.loads(tok(phi3_model, "--file", "-", "--special", data=text.encode()))
    assert chat_ids(phi3_model, msgs) == want
    info = json.loads(tok(phi3_model, "--info"))
    end = json.loads(tok(phi3_model, "--file", "-", "--special", data=b"<|end|>"))
    assert len(end) == 1 and end[0] in info["eog"], info  # a turn ends there
    srv = Rkvd(phi3_model, tmp_path_factory.mktemp("phi3srv")).start()
    try:
        st, r = chat(srv, msgs)
        assert st == 200, r
        assert r["usage"]["prompt_tokens"] == len(want)
    finally:
        _stop_checked(srv)
