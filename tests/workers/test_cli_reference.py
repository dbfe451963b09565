"""The README's CLI reference is the parser's: regenerate with `gpuheal cli-reference`."""

from pathlib import Path

from workers.cli_parser import build_parser
from workers.cli_reference import END, START, cli_reference


def test_readme_cli_reference_is_generated_from_the_parser():
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    section = readme[readme.index(START):readme.index(END) + len(END)]
    assert section == cli_reference(build_parser()), "README's CLI reference drifted: `gpuheal cli-reference`"
    assert "`gpuheal report NODE" in section and "--watch-condition" in section
