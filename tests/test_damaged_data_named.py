"""A damaged data file is named for what it is (issue 39, minor items): a corrupt parquet (or jsonl, csv,
arrow) file is "not readable", never "empty", and abl's own message is the only line: the library's raw log
line ("Failed to read file ...") is not printed before it."""

import pytest


def damaged(tmp_path, kind):
    if kind == "parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        path = tmp_path / "d.parquet"
        pq.write_table(pa.table({"text": pa.array(["hello world"] * 50, pa.string())}), path)
        data = path.read_bytes()
        path.write_bytes(data[: len(data) // 2] + b"\x00garbage" * 8)  # cut and overwritten: no footer
    elif kind == "parquet of another format":
        path = tmp_path / "d.parquet"
        path.write_bytes(b"this is not parquet at all\n" * 20)
    else:
        path = tmp_path / "d.jsonl"
        path.write_text('{"text": "fine"}\n{"text": "cut off\n')
    return path


@pytest.mark.parametrize("kind", ["parquet", "parquet of another format", "jsonl"])
def test_a_corrupt_data_file_is_named_unreadable_not_empty_and_only_abls_line_is_printed(tmp_path, kind, capfd):
    pytest.importorskip("datasets")
    from abl.data.corpus import DataError
    from abl.plugins.datasets import hf_dataset

    path = damaged(tmp_path, kind)
    with pytest.raises(DataError) as info:
        hf_dataset(str(path))
    message = str(info.value)
    assert "is empty" not in message, message
    assert "not readable" in message, message
    out, err = capfd.readouterr()
    assert "Failed to read file" not in out + err, out + err  # no raw library line before abl's message
    assert out + err == "", out + err
