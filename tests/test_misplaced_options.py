"""A misplaced option is one message saying where it goes, exit status 2, no traceback (issue 40, finding 7):
an option of a command given before it, an option of another command, a KEY=VALUE option given as two
words; and a missing grid file gets a closest match only when one is close."""

import pytest
from click.testing import CliRunner

from abl.cli import cli


def run(args):
    r = CliRunner().invoke(cli, args)
    assert r.exception is None or isinstance(r.exception, SystemExit), r.exception
    assert "Traceback" not in r.output
    return r


@pytest.mark.parametrize("args, says", [
    (["--dry-run", "run", "g.toml"], "--dry-run is an option of `abl run`, not of abl itself: it goes after the "
                                     "command: abl run --dry-run g.toml"),
    (["--db", "X", "compare", "E"], "abl compare --db X E"),
    (["--db=X", "compare", "E"], "abl compare --db=X E"),
    (["--dry-run"], "it is an option of `abl run` (abl run --dry-run GRID_FILE)"),
    (["compare", "--dry-run", "E"], "--dry-run is not an option of `abl compare`"),
    (["run", "--set", "train.steps", "3", "g.toml"], "write --set train.steps=3"),
    (["cost", "--set", "train.steps", "3", "g.toml"], "write --set train.steps=3"),
])
def test_a_misplaced_option_says_where_it_goes(args, says):
    r = run(args)
    assert r.exit_code == 2, r.output
    assert says in r.output, r.output
    assert "Usage:" not in r.output  # one message, not click's usage block


def test_a_key_without_value_keeps_the_options_own_message(tmp_path):
    r = run(["run", "--set", "train.steps", str(tmp_path / "g.toml")])
    assert r.exit_code == 2 and "two" not in r.output, r.output


def test_an_option_given_to_the_wrong_command_names_the_commands_that_have_it():
    r = run(["ingest", "--dry-run", "x"])
    assert r.exit_code == 2 and "`abl run` (abl run --dry-run GRID_FILE)" in r.output, r.output


def test_a_misspelt_option_of_the_command_keeps_the_closest_spelling():
    r = run(["compare", "--db-path", "E"])
    assert r.exit_code == 2 and "Did you mean '--db'" in r.output, r.output


def test_an_option_no_command_has_is_clicks_error():
    r = run(["--bogus", "run"])
    assert r.exit_code == 2 and "No such option '--bogus'" in r.output, r.output


def test_options_in_their_place_still_parse():
    r = run(["run", "--set", "train.steps=3", "--help"])
    assert r.exit_code == 0, r.output


def test_a_missing_grid_gets_no_unrelated_file_beside_it(tmp_path, monkeypatch):
    """``mygrid.toml`` is not close to ``typo.toml`` (the shared ``.toml`` made them look so)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "typo.toml").write_text("[experiment]\nname = 'x'\n")
    r = run(["run", "mygrid.toml", "--dry-run"])
    assert r.exit_code == 2 and "no such file" in r.output, r.output
    assert "did you mean" not in r.output and "the shipped grids, usable by name" in r.output, r.output
    r = run(["run", "typp.toml", "--dry-run"])
    assert r.exit_code == 2 and "did you mean 'typo.toml'" in r.output, r.output
