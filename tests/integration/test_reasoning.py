"""Reasoning content through the real openai client against a real rkvd: a thinking template's
<think> block comes back as reasoning_content (one-shot and streamed as
delta.reasoning_content), Qwen 3's block opened by the model and DeepSeek-R1's opened by the
prompt; chat_template_kwargs and reasoning_effort reach the template as variables, rendered as
jinja2 renders them. Answers come from rkvd's test-only test_scripted_output, as in
test_tools.py."""
import json

import pytest

from conftest import _stop_checked
from test_chat_template import tok
from test_tools import ASK, TOOLS, bad, client, reference_ids, rkv_ids, start, stream

openai = pytest.importorskip("openai")

# DeepSeek-R1's layout: the generation prompt opens the thinking block
R1 = ("{{ bos_token }}{% for m in messages %}{% if m['role'] == 'user' %}"
      "{{ '<｜User｜>' + m['content'] }}{% elif m['role'] == 'assistant' %}"
      "{{ '<｜Assistant｜>' + m['content'] + '<｜end▁of▁sentence｜>' }}{% endif %}{% endfor %}"
      "{% if add_generation_prompt %}{{ '<｜Assistant｜><think>\\n' }}{% endif %}"
      "{# </think> closes it #}")


def answer(srv, **kw):
    r = client(srv).chat.completions.create(model="tiny", messages=ASK, max_tokens=2, **kw)
    m = r.choices[0].message
    return m.content, (m.model_extra or {}).get("reasoning_content"), r.choices[0].finish_reason


@pytest.mark.parametrize("script,content,reasoning", [
    ("<think>\nThe user asks about weather.\n</think>\n\nIt is sunny.", "It is sunny.",
     "\nThe user asks about weather.\n"),
    ("<think>only thoughts</think>", None, "only thoughts"),
    ("No block <think>here</think>", "No block <think>here</think>", None),
])
def test_qwen3_thinking_split(tiny_model, tmp_path_factory, script, content, reasoning):
    srv = start(tiny_model, tmp_path_factory, "qwen3", script)
    try:
        assert answer(srv) == (content, reasoning, "stop")
        s_content, s_reasoning, calls, finish = stream(srv)
        assert (s_content, s_reasoning, calls, finish) == (content or "", reasoning or "", [],
                                                           "stop")
    finally:
        _stop_checked(srv)


def test_qwen3_thinking_then_a_call(tiny_model, tmp_path_factory):
    script = ('<think>I need the weather tool.</think>\n\n<tool_call>\n{"name": "get_weather", '
              '"arguments": {"city": "Paris"}}\n</tool_call>')
    srv = start(tiny_model, tmp_path_factory, "qwen3", script)
    try:
        r = client(srv).chat.completions.create(model="tiny", messages=ASK, tools=TOOLS,
                                                max_tokens=2)
        m = r.choices[0].message
        assert m.content is None
        assert m.model_extra["reasoning_content"] == "I need the weather tool."
        assert [(c.function.name, json.loads(c.function.arguments)) for c in m.tool_calls] == \
            [("get_weather", {"city": "Paris"})]
        assert r.choices[0].finish_reason == "tool_calls"
        content, reasoning, calls, finish = stream(srv, tools=TOOLS)
        assert (content, reasoning, finish) == ("", "I need the weather tool.", "tool_calls")
        assert [c["name"] for c in calls] == ["get_weather"]
    finally:
        _stop_checked(srv)


def test_deepseek_r1_prompt_opens_the_block(tiny_model, tmp_path_factory, tmp_path):
    path = tmp_path / "r1.jinja"
    path.write_text(R1)
    for script, content, reasoning in [
            ("First, 2 + 2.\nSo 4.</think>\n\nThe answer is 4.", "The answer is 4.",
             "First, 2 + 2.\nSo 4."),
            ("cut off while thinking", None, "cut off while thinking")]:
        srv = start(tiny_model, tmp_path_factory, path, script)
        try:
            assert answer(srv) == (content, reasoning, "stop")
            s = stream(srv)
            assert (s[0], s[1], s[3]) == (content or "", reasoning, "stop")
        finally:
            _stop_checked(srv)


def test_enable_thinking_false_renders_as_jinja2(tiny_model, tmp_path_factory):
    srv = start(tiny_model, tmp_path_factory, "qwen3", "Just the answer.")
    try:
        kwargs = {"enable_thinking": False}
        want, text = reference_ids(tiny_model, "qwen3", ASK, None, **kwargs)
        assert text.endswith("<think>\n\n</think>\n\n")
        assert rkv_ids(srv, ASK, chat_template_kwargs=kwargs) == want
        assert len(want) > len(rkv_ids(srv, ASK))
        r = client(srv).chat.completions.create(
            model="tiny", messages=ASK, max_tokens=2, extra_body={"chat_template_kwargs": kwargs})
        assert r.usage.prompt_tokens == len(want)
        assert r.choices[0].message.content == "Just the answer."
        assert "reasoning_content" not in (r.choices[0].message.model_extra or {})
    finally:
        _stop_checked(srv)


def test_reasoning_effort_is_a_template_variable(tiny_model, tmp_path_factory, tmp_path):
    path = tmp_path / "effort.jinja"
    path.write_text("{{ bos_token }}{% for m in messages %}{{ m['content'] }}\n{% endfor %}"
                    "effort={{ reasoning_effort | default('none') }}")
    srv = start(tiny_model, tmp_path_factory, path, "ok")
    try:
        c = client(srv)
        for effort in ("low", "high"):
            r = c.chat.completions.create(model="tiny", messages=ASK, max_tokens=1,
                                          reasoning_effort=effort)
            text = "".join(m["content"] + "\n" for m in ASK) + f"effort={effort}"
            want = json.loads(tok(tiny_model, "--file", "-", "--bos", "--special",
                                  data=text.encode()))
            assert r.usage.prompt_tokens == len(want)
        err = bad(lambda: c.chat.completions.create(model="tiny", messages=ASK, max_tokens=1,
                                                    extra_body={"reasoning_effort": "max"}))
        assert err["param"] == "reasoning_effort", err
        err = bad(lambda: c.chat.completions.create(
            model="tiny", messages=ASK, max_tokens=1,
            extra_body={"chat_template_kwargs": {"messages": []}}))
        assert err["param"] == "chat_template_kwargs.messages", err
        err = bad(lambda: c.chat.completions.create(
            model="tiny", messages=ASK, max_tokens=1, extra_body={"chat_template_kwargs": 3}))
        assert err["param"] == "chat_template_kwargs", err
    finally:
        _stop_checked(srv)


def test_no_thinking_template_leaves_think_as_content(tiny_model, tmp_path_factory):
    srv = start(tiny_model, tmp_path_factory, "qwen25", "<think>a</think>b")
    try:
        assert answer(srv) == ("<think>a</think>b", None, "stop")
    finally:
        _stop_checked(srv)
