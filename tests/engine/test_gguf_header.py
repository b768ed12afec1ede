"""engine.quant.gguf_header and engine.gguf_config read what gguf's GGUFReader and
transformers' AutoConfig read (they parse the whole vocabulary, ~35 s each for Gemma 3's
262k tokens): the same scalar fields, vocabulary, tensor types, shapes and offsets, and the
same config, on a small Gemma 3 and Llama file that has every kind of field."""
import numpy as np
import pytest
from gguf import GGMLQuantizationType, GGUFReader, GGUFWriter
from transformers import AutoConfig

from engine.gguf_config import config_arrays, gguf_config
from engine.quant.gguf_header import read_header
from engine.quant.gguf_index import build_index

VOCAB = ["<pad>", "<eos>", "<bos>", "▁the", "é", "<start_of_turn>"] + [f"t{i}" for i in range(58)]


def write_gguf(path, architecture):
    writer = GGUFWriter(path, architecture)
    writer.add_name("tiny")
    writer.add_context_length(1024)
    writer.add_block_count(1)
    writer.add_embedding_length(32)
    writer.add_feed_forward_length(64)
    writer.add_head_count(2)
    writer.add_head_count_kv(1)
    writer.add_key_length(16)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_rope_freq_base(1e6)
    writer.add_sliding_window(512)
    writer.add_tokenizer_model("llama")
    writer.add_token_list(VOCAB)
    writer.add_token_scores([-float(i) for i in range(len(VOCAB))])
    writer.add_token_types([3, 3, 3, 1, 1, 4] + [1] * 58)
    writer.add_add_bos_token(True)
    writer.add_array("tiny.words", ["a", "bc"])
    writer.add_array("tiny.skipped", ["x", "yz"])  # not asked for: skipped by its lengths
    writer.add_array("tiny.sizes", [1, 2, 3])
    writer.add_tensor("token_embd.weight", np.ones((len(VOCAB), 32), np.float16))
    writer.add_tensor("blk.0.attn_q.weight", np.zeros((32, 34), np.uint8),
                      raw_dtype=GGMLQuantizationType.Q8_0)  # 32 rows of 32 as Q8_0 blocks
    writer.add_tensor("output_norm.weight", np.ones(32, np.float32))
    if architecture == "llama":  # an untied head
        writer.add_tensor("output.weight", np.ones((len(VOCAB), 32), np.float16))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.mark.parametrize("architecture", ["gemma3", "llama"])
def test_the_header_and_config_are_ggufreaders_and_autoconfigs(tmp_path, architecture):
    path = write_gguf(tmp_path / "tiny.gguf", architecture)
    reader = GGUFReader(path)
    wanted = config_arrays() | {"tiny.words"}
    header = read_header(path, wanted)
    scalars = {k: f.contents() for k, f in reader.fields.items()
               if len(f.types) == 1 and not k.startswith("GGUF.")}
    arrays = {k for k, f in reader.fields.items() if len(f.types) > 1}
    assert {k: v for k, v in header.fields.items() if k in scalars} == scalars
    assert set(header.fields) - set(scalars) == arrays & wanted  # the others skipped
    for key in ("tokenizer.ggml.tokens", "tokenizer.ggml.scores", "tokenizer.ggml.token_type",
                "tiny.words"):
        assert list(header.fields[key]) == reader.fields[key].contents()
    assert build_index(path) == {
        "architecture": architecture,
        "tensors": [[t.name, t.tensor_type.name, [int(d) for d in t.shape], int(t.data_offset)]
                    for t in reader.tensors]}
    assert (gguf_config(path, header).to_dict()
            == AutoConfig.from_pretrained(path.parent, gguf_file=path.name).to_dict())


def test_a_file_that_is_not_gguf_is_refused(tmp_path):
    (tmp_path / "x.gguf").write_bytes(b"GGML" + bytes(20))
    with pytest.raises(ValueError, match="not a GGUF file"):
        read_header(tmp_path / "x.gguf")
