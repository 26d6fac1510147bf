"""``failsoft zoo add NAME DIR --format hf`` of a causal LM: a random-weight Llama saved with
``save_pretrained`` beside a BPE tokenizer trained here (chat template included) is copied into the
repository and measured: weight bytes, KV bytes per token, load time, TTFT/TPOT per batch size."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from failsoft.cli import main
from failsoft.errors import ConfigError
from failsoft.zoo import ModelRepository
from failsoft.zoo.llm_add import RECORD_FILE, add_llm, is_causal_lm
from tests.llm.tinymodels import save_model, train_tokenizer


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_model(tmp_path_factory.mktemp("hf"), "llama", train_tokenizer(), 64, 2, seed=1)


@pytest.mark.slow
def test_zoo_add_of_a_causal_lm_records_sizes_load_and_speeds_per_batch(
    capsys: pytest.CaptureFixture[str], llama_dir: Path, tmp_path: Path
) -> None:
    assert is_causal_lm(llama_dir) and not is_causal_lm(llama_dir, "text-classification")
    root = tmp_path / "zoo"
    code = main(["zoo", "add", "chat/llama-tiny", str(llama_dir), "--format", "hf", "--out", str(root)])
    out = capsys.readouterr().out
    assert code == 0 and "added chat/llama-tiny (hf causal LM llama" in out
    record = json.loads((root / "chat" / "llama-tiny" / RECORD_FILE).read_text())
    shards = sum(p.stat().st_size for p in llama_dir.glob("*.safetensors"))
    assert record["weights"]["file_bytes"] == shards
    assert record["weights"]["parameter_bytes"] == record["weights"]["parameters"] * 4  # float32
    # Eq. 1: 2 (K and V) x 2 layers x 2 KV heads x head_dim 16 x 4 bytes, and a forward agrees
    assert record["kv_bytes_per_token"] == record["kv_bytes_per_token_forward"] == 2 * 2 * 2 * 16 * 4
    assert record["load_ms"] > 0
    assert [b["batch"] for b in record["batches"]] == [1, 2, 4, 8]
    assert all(b["ttft_ms"] > 0 and b["tpot_ms"] > 0 and b["tokens_per_s"] > 0 for b in record["batches"])
    assert record["tokenizer"]["chat_template"] is True
    served = Path(record["path"])  # what an llm service's model.path names
    assert (served / "config.json").is_file() and (served / "tokenizer.json").is_file()
    assert ModelRepository(root).family_names() == []  # not a classifier variant: left out of plans
    with pytest.raises(ConfigError, match="already in"):
        add_llm(root, "chat", "llama-tiny", llama_dir, "cpu")


def test_zoo_add_refuses_a_causal_lm_without_safetensors_leaving_nothing(tmp_path: Path) -> None:
    bad = tmp_path / "pickled"
    bad.mkdir()
    (bad / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))
    (bad / "pytorch_model.bin").write_bytes(b"not loaded")
    root = tmp_path / "zoo"
    with pytest.raises(ConfigError, match="only pickled weights"):
        add_llm(root, "chat", "bad", bad, "cpu")
    assert not root.exists()
