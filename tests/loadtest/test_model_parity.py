"""`python -m loadtest.model_parity` prints one row per family and backend, measured."""
from loadtest import model_parity


def test_parity_table_rows_are_measured(capsys):
    model_parity.main(["--families", "qwen2-yarn", "--backends", "torch"])
    lines = capsys.readouterr().out.splitlines()
    assert lines[1].startswith("| family | what it covers |")
    row = [cell.strip() for cell in lines[3].strip("|").split("|")]
    assert row[:3] == ["qwen2-yarn", "qwen2, rope yarn, untied, qkv bias", "torch"]
    assert row[3] == "96/96"
    assert float(row[4]) < 1e-4
    assert len(lines) == 4
