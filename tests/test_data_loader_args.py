"""``persia-launcher data-loader`` reads its flags where PERSIA's users write them.

PERSIA documents ``persia-launcher data-loader data_loader.py --replica-size 1
--replica-index 0``: flags after the script are the launcher's (its click command parsed
them anywhere). They were passed to the script instead, so a second replica silently ran
as replica 0 of 1 and sent the same batches as the first.
"""

from __future__ import annotations

import pytest

from pyrsia.services.data_loader.launch import parse_args


def test_launcher_flags_after_the_script_are_the_launchers():
    args = parse_args(["data_loader.py", "--replica-index", "1", "--replica-size", "2"])
    assert (args.script, args.replica_index, args.replica_size) == ("data_loader.py", 1, 2)
    assert args.script_args == []


def test_unknown_flags_and_everything_after_a_double_dash_go_to_the_script():
    args = parse_args(
        ["--replica-size=2", "dl.py", "--lr", "0.1", "--replica-index", "1", "--", "--resume"]
    )
    assert (args.replica_index, args.replica_size, args.resume) == (1, 2, False)
    assert args.script_args == ["--lr", "0.1", "--resume"]


def test_a_bad_launcher_flag_value_is_refused_naming_it(capsys):
    with pytest.raises(SystemExit) as exc:
        parse_args(["dl.py", "--replica-index", "one"])
    assert exc.value.code == 2
    assert "--replica-index" in capsys.readouterr().err
