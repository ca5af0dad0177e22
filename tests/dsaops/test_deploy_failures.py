"""`dsaops deploy`'s failure line says why a task failed, from real ansible-runner events of a local play."""
import os
import sys

import pytest
import yaml

from dsaops.deploy import Progress

ansible_runner = pytest.importorskip("ansible_runner")


def failure_lines(tmp_path, task: dict) -> list[str]:
    """The failure lines Progress prints for a one-task play on this machine."""
    (tmp_path / "project").mkdir()
    play = [{"hosts": "localhost", "connection": "local", "gather_facts": False, "tasks": [task]}]
    (tmp_path / "project/play.yml").write_text(yaml.safe_dump(play))
    progress = Progress(quiet=True, verbose=False)
    # the ansible-playbook beside this Python, as dsaops deploy finds it (a virtual environment need not be active)
    path = os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")])
    result = ansible_runner.run(private_data_dir=str(tmp_path), playbook="play.yml", quiet=True,
                                envvars={"PATH": path}, event_handler=progress.on_event)
    assert result.rc != 0
    return progress.failures


def test_a_failed_command_names_its_exit_code_and_last_output_lines(tmp_path):
    said = "echo pulling >&2; echo one >&2; echo 'write /var/lib/docker/tmp/x: no space left on device' >&2; exit 3"
    failures = failure_lines(tmp_path, {"name": "Load the image", "ansible.builtin.command": {"argv": ["sh", "-c", said]}})
    assert failures == [("localhost: Load the image: non-zero return code (exit 3): pulling / one / "
                         "write /var/lib/docker/tmp/x: no space left on device")]


def test_a_failed_command_without_error_output_names_its_last_lines_of_output(tmp_path):
    failures = failure_lines(tmp_path, {"name": "Fetch", "ansible.builtin.command": {
        "argv": ["sh", "-c", "seq 1 5; printf '%0300d\\n' 7; exit 2"]}})
    assert failures == [f"localhost: Fetch: non-zero return code (exit 2): 4 / 5 / {'0' * 240}"]   # a line cut at 240


def test_each_failed_item_of_a_looped_command_says_why(tmp_path):
    failures = failure_lines(tmp_path, {"name": "Each", "ansible.builtin.command": {
        "argv": ["sh", "-c", "echo \"{{ item }} refused\" >&2; exit {{ item }}"]}, "loop": [0, 4]})
    assert failures == ["localhost: Each: non-zero return code (exit 4): 4 refused"]


@pytest.mark.parametrize("task, line", [
    # the negative controls: a message of its own is shown as it is, and a silent command keeps Ansible's
    ({"name": "Check", "ansible.builtin.assert": {"that": "1 == 2", "fail_msg": "one is not two", "quiet": True}},
     "localhost: Check: one is not two"),
    ({"name": "Quiet", "ansible.builtin.command": {"argv": ["false"]}}, "localhost: Quiet: non-zero return code"),
])
def test_a_failure_with_nothing_more_to_say_keeps_its_message(tmp_path, task, line):
    assert failure_lines(tmp_path, task) == [line]


def test_a_rescued_command_keeps_its_line_before_the_rescue_s_own(tmp_path):
    # the image role's copy: `docker load` fails inside a block whose rescue stops with a message of its own
    block = {"name": "Copy", "block": [{"name": "Load", "ansible.builtin.command": {
        "argv": ["sh", "-c", "echo 'no space left on device' >&2; exit 1"]}}],
        "rescue": [{"name": "Stop", "ansible.builtin.fail": {"msg": "node1 keeps its build"}}]}
    assert failure_lines(tmp_path, block) == [
        "localhost: Load: non-zero return code (exit 1): no space left on device",
        "localhost: Stop: node1 keeps its build"]
