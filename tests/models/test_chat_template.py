"""Our chat-template rendering equals transformers' `apply_chat_template`, text and ids.

The reference is a `transformers.PreTrainedTokenizerFast` built straight from the
tokenizer.json of a byte-level BPE trained here (no download), with the template set
on it, so nothing of ours (save, load) sits between the two sides.
"""

import json
import os
import random

import pytest

transformers = pytest.importorskip("transformers")

from isojax.models import chat_template  # pylint: disable=g-import-not-at-top
from isojax.models import tokenizer as tokenizer_lib  # pylint: disable=g-import-not-at-top

QWEN_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
LLAMA_SPECIALS = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>",
                  "<|end_header_id|>", "<|eot_id|>"]

# Resembles Llama 3 Instruct's template: BOS first, a header per turn, contents
# trimmed, <|eot_id|> closing each turn.
LLAMA3_CHAT_TEMPLATE = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}"
    "{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'"
    " + message['content'] | trim + '<|eot_id|>' %}"
    "{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}"
    "{{ content }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}"
    "{% endif %}")

USER = {"role": "user", "content": "What is seven plus eight? Answer with a number."}
CONVERSATIONS = {
    "user_only": [USER],
    "with_system": [{"role": "system", "content": "You are a careful tutor."}, USER],
    "multi_turn": [{"role": "system", "content": "  Be brief.\n"}, USER,
                   {"role": "assistant", "content": "Fifteen.  "},
                   {"role": "user", "content": "café? naïve 🙂\n  and eight <b>&</b>"}],
}


def _corpus(n=300):
  rng = random.Random(0)
  words = ("the a cat dog what is seven plus eight answer with number you are careful "
           "tutor be brief fifteen café naïve assistant user system hello world").split()
  return [" ".join(rng.choice(words) for _ in range(rng.randint(3, 12))) + rng.choice(".?!\n")
          for _ in range(n)]


def _pair(ours, tmp_dir):
  """(our TextTokenizer, transformers' tokenizer from the same tokenizer.json)."""
  file = str(tmp_dir / "tokenizer.json")
  ours.tokenizer.save(file)
  theirs = transformers.PreTrainedTokenizerFast(tokenizer_file=file, **ours.special_tokens)
  theirs.chat_template = ours.chat_template
  return ours, theirs


@pytest.fixture(scope="module")
def qwen_pair(tmp_path_factory):
  return _pair(tokenizer_lib.train_bpe_tokenizer(
      _corpus(), vocab_size=400, special_tokens=QWEN_SPECIALS, eos="<|im_end|>",
      pad="<|endoftext|>", bos=None, chat_template=chat_template.QWEN_CHAT_TEMPLATE),
               tmp_path_factory.mktemp("qwen"))


@pytest.fixture(scope="module")
def llama_pair(tmp_path_factory):
  return _pair(tokenizer_lib.train_bpe_tokenizer(
      _corpus(), vocab_size=400, special_tokens=LLAMA_SPECIALS, eos="<|eot_id|>",
      pad="<|end_of_text|>", bos="<|begin_of_text|>", chat_template=LLAMA3_CHAT_TEMPLATE),
               tmp_path_factory.mktemp("llama"))


@pytest.fixture(params=["qwen", "llama"])
def pair(request):
  return request.getfixturevalue(f"{request.param}_pair")


@pytest.mark.parametrize("name", sorted(CONVERSATIONS))
@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_render_and_ids_match_transformers(pair, name, add_generation_prompt):
  ours, theirs = pair
  messages = CONVERSATIONS[name]
  text = ours.render_chat(messages, add_generation_prompt=add_generation_prompt)
  assert text == theirs.apply_chat_template(
      messages, tokenize=False, add_generation_prompt=add_generation_prompt)
  ids = theirs.apply_chat_template(messages, tokenize=True, return_dict=False,
                                   add_generation_prompt=add_generation_prompt)
  assert ours.encode(text, add_bos=False) == ids
  assert text.endswith("assistant\n" if "im_start" in text else "<|end_header_id|>\n\n") == (
      add_generation_prompt)


def test_qwen_template_layout():
  text = chat_template.render(chat_template.QWEN_CHAT_TEMPLATE, [USER])
  assert text == ("<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
                  f"<|im_start|>user\n{USER['content']}<|im_end|>\n<|im_start|>assistant\n")
  text = chat_template.render(chat_template.QWEN_CHAT_TEMPLATE, CONVERSATIONS["with_system"],
                              add_generation_prompt=False)
  assert text == ("<|im_start|>system\nYou are a careful tutor.<|im_end|>\n"
                  f"<|im_start|>user\n{USER['content']}<|im_end|>\n")


def test_llama_template_gets_exactly_one_bos(llama_pair):
  ours, _ = llama_pair
  text = ours.render_chat([USER])
  ids = ours.encode(text, add_bos=False)
  assert ids[0] == ours.bos_id and ids.count(ours.bos_id) == 1
  assert ours.encode(text)[:2] == [ours.bos_id, ours.bos_id]  # why add_bos=False exists


# Each template exercises one piece of transformers' jinja environment.
ENVIRONMENT_TEMPLATES = {
    # trim_blocks and lstrip_blocks: no dashes, tags on their own indented lines
    "whitespace": ("{% for m in messages %}\n  {% if m.role == 'user' %}\n"
                   "    U: {{ m.content }}\n  {% else %}\n    {{ m.role }}: {{ m.content }}\n"
                   "  {% endif %}\n{% endfor %}\n{% if add_generation_prompt %}\nA:{% endif %}"),
    "tojson": "{{ messages | tojson }}|{{ messages[0] | tojson(indent=2) }}",
    "loopcontrols": ("{% for m in messages %}{% if loop.index > 2 %}{% break %}{% endif %}"
                     "{% if m.role == 'system' %}{% continue %}{% endif %}[{{ m.content }}]"
                     "{% endfor %}"),
    "none_dropped": "{% for m in messages %}{{ 'name' in m }},{{ m.name is defined }};"
                    "{% endfor %}{{ tools is none }}{{ documents is none }}",
    "kwargs_and_tokens": "{{ bos_token }}|{{ eos_token }}|{{ pad_token }}|{{ enable_thinking }}",
    "namespace": ("{% set ns = namespace(n=0) %}{% for m in messages %}{% set ns.n = ns.n + 1 %}"
                  "{% endfor %}{{ ns.n }}{{ dict(a=1)['a'] }}"),
    "strftime": "{{ strftime_now('%Y-%m') }}",
    "reasoning": "{% for m in messages %}{{ m.reasoning_content }}/{{ m.thinking }};{% endfor %}",
    # transformers' block tag, as SmolLM3's and Phi-4-reasoning's templates use it
    "generation": ("{%- for m in messages -%}{%- if m.role == 'assistant' -%}"
                   "{% generation %}{{ '<|im_start|>assistant\n' + m.content }}"
                   "{% if m.thinking %}[{{ m.thinking }}]{% endif %}{{ '<|im_end|>\n' }}"
                   "{% endgeneration %}{%- else -%}"
                   "{{ '<|im_start|>' + m.role + '\n' + m.content + '<|im_end|>\n' }}"
                   "{%- endif -%}{%- endfor -%}"
                   "{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"),
}


@pytest.mark.parametrize("name", sorted(ENVIRONMENT_TEMPLATES))
def test_environment_matches_transformers(pair, name):
  ours, theirs = pair
  template = ENVIRONMENT_TEMPLATES[name]
  messages = CONVERSATIONS["multi_turn"] + [
      {"role": "user", "content": "é <b>&'\"", "name": None},
      {"role": "assistant", "content": "ok", "thinking": "hmm"}]
  kwargs = {"enable_thinking": False} if name == "kwargs_and_tokens" else {}
  want = theirs.apply_chat_template(messages, chat_template=template, tokenize=False,
                                    add_generation_prompt=True, **kwargs)
  got = chat_template.render(template, messages, special_tokens=ours.special_tokens, **kwargs)
  assert got == want


def test_syntax_error_names_the_file():
  with pytest.raises(ValueError, match=r"my_template\.jinja.*TemplateSyntaxError"):
    chat_template.render("{% if messages %}unclosed", [USER], source="my_template.jinja")


def test_raise_exception_names_the_file_and_message():
  template = ("{% if messages[0].role != 'system' %}{{ raise_exception('need a system turn') }}"
              "{% endif %}")
  with pytest.raises(ValueError, match=r"tpl\.json.*need a system turn"):
    chat_template.render(template, [USER], source="tpl.json")


def _write_checkpoint(path, ours, **tokenizer_config):
  ours.tokenizer.save(os.path.join(path, "tokenizer.json"))
  with open(os.path.join(path, "tokenizer_config.json"), "w") as f:
    json.dump({"eos_token": "<|im_end|>", **tokenizer_config}, f)


@pytest.fixture(scope="module")
def qwen(qwen_pair):
  return qwen_pair[0]


def test_bad_template_in_checkpoint_names_tokenizer_config(tmp_path, qwen):
  _write_checkpoint(tmp_path, qwen, chat_template="{% for m in messages %}{{ m.content }")
  tok = tokenizer_lib.load_tokenizer(str(tmp_path))
  with pytest.raises(ValueError, match=r"tokenizer_config\.json.*failed to render"):
    tok.render_chat([USER])


def test_missing_template_is_a_clear_error(tmp_path, qwen):
  _write_checkpoint(tmp_path, qwen)
  with pytest.raises(ValueError, match=r"no chat template"):
    tokenizer_lib.load_tokenizer(str(tmp_path)).render_chat([USER])


def test_named_templates_take_default(tmp_path, qwen):
  _write_checkpoint(tmp_path, qwen, chat_template=[
      {"name": "tool_use", "template": "TOOLS"},
      {"name": "default", "template": chat_template.QWEN_CHAT_TEMPLATE}])
  tok = tokenizer_lib.load_tokenizer(str(tmp_path))
  assert tok.chat_template == chat_template.QWEN_CHAT_TEMPLATE
  theirs = transformers.AutoTokenizer.from_pretrained(str(tmp_path))
  assert tok.render_chat([USER]) == theirs.apply_chat_template(
      [USER], tokenize=False, add_generation_prompt=True)


def test_named_templates_without_default_fail_at_load(tmp_path, qwen):
  _write_checkpoint(tmp_path, qwen, chat_template=[{"name": "tool_use", "template": "T"}])
  with pytest.raises(ValueError, match=r"tokenizer_config\.json.*'default'"):
    tokenizer_lib.load_tokenizer(str(tmp_path))


def test_chat_template_jinja_file_wins_as_in_transformers(tmp_path, qwen):
  _write_checkpoint(tmp_path, qwen, chat_template="OLD {{ messages[0].content }}")
  with open(tmp_path / "chat_template.jinja", "w") as f:
    f.write(chat_template.QWEN_CHAT_TEMPLATE)
  tok = tokenizer_lib.load_tokenizer(str(tmp_path))
  assert tok.chat_template_source.endswith("chat_template.jinja")
  theirs = transformers.AutoTokenizer.from_pretrained(str(tmp_path))
  for add in (True, False):
    assert tok.render_chat([USER], add_generation_prompt=add) == theirs.apply_chat_template(
        [USER], tokenize=False, add_generation_prompt=add)
