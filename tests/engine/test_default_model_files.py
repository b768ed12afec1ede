"""The default model's config and tokenizer are read without transformers' Auto classes
(engine/loader.py: importing them costs a CPU server ~135 MiB of RSS through torch._dynamo
and Triton): what the engine reads must be what the Auto classes give, and a CPU server must
not import those modules at all."""
import os
import subprocess
import sys

from engine import loader
from engine.models.config import from_hf_config

TEXTS = ["Hello, world!", "  leading spaces and trailing  ", "naïve café — 東京 🚀",
         "def f(x):\n\treturn x ** 2  # code", "<|im_start|>user\nHi<|im_end|>"]
CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"},
        {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "Name a fruit."}]


def test_config_reads_as_auto_config_does():
    from transformers import AutoConfig  # not at collection: it imports torch._dynamo

    path = loader.default_model_dir()
    eos = (2,)
    assert (from_hf_config(loader._hf_config(path), eos)
            == from_hf_config(AutoConfig.from_pretrained(path), eos))


def test_tokenizer_is_the_one_auto_tokenizer_picks():
    from transformers import AutoTokenizer

    path = loader.default_model_dir()
    ours = loader._tokenizer(path)
    auto = AutoTokenizer.from_pretrained(path, clean_up_tokenization_spaces=False)
    assert type(ours) is type(auto)
    for text in TEXTS:
        ids = auto.encode(text)
        assert ours.encode(text) == ids
        assert ours.decode(ids) == auto.decode(ids)
    assert (ours.apply_chat_template(CHAT, tokenize=False, add_generation_prompt=True)
            == auto.apply_chat_template(CHAT, tokenize=False, add_generation_prompt=True))
    assert ours.all_special_ids == auto.all_special_ids


def test_cpu_server_imports_neither_dynamo_nor_triton():
    """The gateway and a loaded default model on CPU, in a fresh process without the
    test suite's TRITON_INTERPRET (a served process has none)."""
    script = ("import sys\n"
              "import gateway.cli.server\n"
              "from engine.llm import LLM\n"
              "LLM(model='default', device='cpu', num_threads=2)\n"
              "print(sorted(m for m in ('torch._dynamo', 'triton', 'transformers.generation.utils')"
              " if m in sys.modules))\n")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                         text=True, timeout=300, check=True)
    assert out.stdout.strip().splitlines()[-1] == "[]", out.stderr[-2000:]
