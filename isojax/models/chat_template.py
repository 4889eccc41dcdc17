"""Chat templates: find a checkpoint's Jinja template and render it as transformers does.

Instruct checkpoints ship a Jinja chat template that turns a list of messages into
the exact prompt text the model was tuned on; a prompt that differs by one newline
or one special token is off-distribution. isojax must not depend on transformers at
run time, so this module re-creates the rendering of
`transformers.utils.chat_template_utils` (transformers 5.23) with plain jinja2: the same
sandboxed environment (trim_blocks, lstrip_blocks, loop controls), the same `tojson`
filter and `raise_exception` / `strftime_now` globals, the same message clean-up and
the same variables (the tokenizer's special tokens, `tools=None`, `documents=None`),
and transformers' `{% generation %}` block tag.
`tests/models/test_chat_template.py` pins the output to transformers'. Older 5.x
releases clean messages differently: 5.17 keeps None-valued keys and does not alias
`thinking` to `reasoning_content`, so templates that test those render differently there.
"""

from __future__ import annotations

import functools
import json
import os
from datetime import datetime
from typing import Any, Mapping

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment

TOKENIZER_CONFIG_FILE = "tokenizer_config.json"
# Newer transformers saves the template beside tokenizer_config.json, and that file
# wins over the config's `chat_template` field when both exist (as in transformers).
CHAT_TEMPLATE_FILE = "chat_template.jinja"

# A Qwen2.5-style ChatML template: a default system turn when the conversation has
# none, every turn as `<|im_start|>role\ncontent<|im_end|>\n`, and an open assistant
# turn as the generation prompt.
QWEN_CHAT_TEMPLATE = (
    "{%- if messages[0]['role'] == 'system' %}\n"
    "    {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}\n"
    "{%- else %}\n"
    "    {{- '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}\n"
    "{%- endif %}\n"
    "{%- for message in messages %}\n"
    "    {%- if not (loop.first and message['role'] == 'system') %}\n"
    "        {{- '<|im_start|>' + message['role'] + '\\n' + message['content']"
    " + '<|im_end|>\\n' }}\n"
    "    {%- endif %}\n"
    "{%- endfor %}\n"
    "{%- if add_generation_prompt %}\n"
    "    {{- '<|im_start|>assistant\\n' }}\n"
    "{%- endif %}\n")

# The names transformers reads a message's reasoning under; the first is the one
# templates use, and it fills `thinking` too (for gpt-oss templates).
_REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")


def _raise_exception(message):
  raise jinja2.exceptions.TemplateError(message)


def _tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
  # Jinja's own tojson escapes <, >, & and ' for HTML; prompts must keep them.
  return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                    sort_keys=sort_keys)


def _strftime_now(format):  # pylint: disable=redefined-builtin
  return datetime.now().strftime(format)


class _Generation(jinja2.ext.Extension):
  """`{% generation %}...{% endgeneration %}`: transformers' marker of the assistant's
  own tokens (for `return_assistant_tokens_mask`), which renders as its body.

  SmolLM3's and Phi-4-reasoning's templates wrap each assistant turn in it; isojax
  renders prompts only, so the block's text is all that matters.
  """
  tags = {"generation"}

  def parse(self, parser):
    lineno = next(parser.stream).lineno
    body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
    return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

  def _body(self, caller):
    return caller()


@functools.lru_cache(maxsize=16)
def _compile(template: str) -> jinja2.Template:
  # Templates come from downloaded checkpoints: untrusted code, hence the sandbox.
  env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                      extensions=[jinja2.ext.loopcontrols, _Generation])
  env.filters["tojson"] = _tojson
  env.globals["raise_exception"] = _raise_exception
  env.globals["strftime_now"] = _strftime_now
  return env.from_string(template)


def _clean_messages(messages: list[dict]) -> list[dict]:
  """Copies as transformers does: drops None-valued keys, aliases the reasoning fields."""
  cleaned = []
  for i, message in enumerate(messages):
    if not isinstance(message, Mapping):
      raise TypeError(f"messages[{i}]: expected a dict with 'role' and 'content', "
                      f"got {message!r}")
    # APIs return `content=None`; templates handle a missing key but print "None".
    message = {k: v for k, v in message.items() if v is not None}
    reasoning = next((message[k] for k in _REASONING_FIELDS if message.get(k) is not None),
                     None)
    if reasoning is not None:
      message = {"thinking": reasoning, **message, "reasoning_content": reasoning}
    cleaned.append(message)
  return cleaned


def render(template: str, messages: list[dict], *, add_generation_prompt: bool = True,
           special_tokens: Mapping[str, str] | None = None, source: str = "<string>",
           **kwargs: Any) -> str:
  """The prompt text for `messages`, as `apply_chat_template(tokenize=False)` gives it.

  `special_tokens` ({"bos_token": ..., "eos_token": ..., ...}) become template
  variables, and `kwargs` (tools, documents, enable_thinking, ...) override them, as in
  transformers. `source` names where the template came from, for error messages.
  Unlike transformers, `add_generation_prompt` defaults to True: isojax renders
  prompts for sampling.
  """
  if not messages:
    raise ValueError("render: the conversation is empty; expected at least one message")
  variables = {**dict(special_tokens or {}), **kwargs}
  variables.setdefault("tools", None)
  variables.setdefault("documents", None)
  try:
    return _compile(template).render(messages=_clean_messages(messages),
                                     add_generation_prompt=add_generation_prompt,
                                     **variables)
  except jinja2.TemplateError as e:
    where = f" (line {e.lineno})" if getattr(e, "lineno", None) else ""
    raise ValueError(f"{source}: the chat template failed to render{where}: "
                     f"{type(e).__name__}: {e}") from e


def load(path: str) -> tuple[str | None, str]:
  """(chat template or None, the file it came from) for the tokenizer in dir `path`."""
  file = os.path.join(path, CHAT_TEMPLATE_FILE)
  if os.path.isfile(file):
    with open(file, encoding="utf-8") as f:
      return f.read(), file
  file = os.path.join(path, TOKENIZER_CONFIG_FILE)
  if not os.path.isfile(file):
    return None, file
  with open(file, encoding="utf-8") as f:
    template = json.load(f).get("chat_template")
  return _default_template(template, file), file


def _default_template(template, file: str) -> str | None:
  """The template itself, or "default" of the list-of-{name, template} form."""
  if template is None or isinstance(template, str):
    return template
  if isinstance(template, list):
    named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
    if isinstance(named.get("default"), str):
      return named["default"]
    raise ValueError(f"{file}: chat_template lists templates {sorted(map(str, named))} but "
                     "none named 'default'; expected one to use for prompts")
  raise ValueError(f"{file}: chat_template is a {type(template).__name__}; expected a "
                   "string or a list of {name, template}")
