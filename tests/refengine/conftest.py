"""Shared fixtures: a tiny random HF Qwen3.5-MoE model and the same weights as F32/F16 qwen35moe GGUFs."""

from __future__ import annotations

import os

import pytest

torch = pytest.importorskip("torch")

# Without a GPU the Triton kernels run on the CPU through Triton's interpreter; the flag must be set before they
# are decorated. With one (pytest -m gpu on the device machine) they are compiled.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
# One intra-op thread: the machine's cores are shared, and two spinning threads per op make tiny shapes 10× slower.
torch.set_num_threads(1)


@pytest.fixture(scope="session")
def hf_model():
    pytest.importorskip("transformers")
    from hf_gguf import tiny_hf_model

    return tiny_hf_model(seed=0)


@pytest.fixture(scope="session")
def hf_gguf(hf_model, tmp_path_factory):
    from hf_gguf import write_gguf

    return write_gguf(hf_model, tmp_path_factory.mktemp("hf") / "tiny-f32.gguf", "F32")


@pytest.fixture(scope="session")
def prompt():
    gen = torch.Generator().manual_seed(1)
    return torch.randint(0, 500, (150,), generator=gen).tolist()  # ids below the tokenizer's control token
