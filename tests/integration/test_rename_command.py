"""`rename-command` in the config file (checklist §8: `old new`, new `""` removes;
conf/disque.conf: "Rename a command, or disable it with an empty name").

The directive is parsed and stored in Config.renamed_commands, but the server never applies
it: the old name keeps working and the new name is an unknown command. An operator who
disables DEBUG or CONFIG this way is silently left with them enabled.
"""

from __future__ import annotations

from tests.integration.resp import Conn, Err
from tests.integration.test_startup import fatal_config


def test_rename_command_gives_the_command_its_new_name(make_server) -> None:  # type: ignore[no-untyped-def]
    proc = make_server(config_text="rename-command QLEN myqlen\n")
    with Conn(proc.port) as c:
        assert c.cmd("MYQLEN", "somequeue") == 0
        reply = c.cmd("QLEN", "somequeue")
        assert isinstance(reply, Err) and "unknown command" in reply


def test_rename_command_to_empty_name_removes_the_command(make_server) -> None:  # type: ignore[no-untyped-def]
    proc = make_server(config_text='rename-command DEBUG ""\nrename-command CONFIG ""\n')
    with Conn(proc.port) as c:
        for argv in (("DEBUG", "JMAP"), ("CONFIG", "GET", "port")):
            reply = c.cmd(*argv)
            assert isinstance(reply, Err) and "unknown command" in reply, (argv, reply)
        assert c.cmd("PING") is not None


def test_rename_command_given_on_the_command_line(make_server) -> None:  # type: ignore[no-untyped-def]
    proc = make_server(args=["--rename-command", "debug", ""])
    with Conn(proc.port) as c:
        reply = c.cmd("DEBUG", "JMAP")
        assert isinstance(reply, Err) and "unknown command" in reply


def test_rename_command_of_an_unknown_command_is_a_fatal_config_error(make_server) -> None:  # type: ignore[no-untyped-def]
    # redis-server: "No such command in rename-command", exit 1
    _, text = fatal_config(make_server, "rename-command NOSUCHCOMMAND foo\n")
    assert "rename-command NOSUCHCOMMAND foo" in text
    assert "No such command in rename-command" in text
