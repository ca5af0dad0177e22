"""Alerts that can fire and reach someone: the playbook's own Prometheus and Alertmanager
configuration, rendered through the monitoring role's real templates by ansible-playbook, run by
the real Prometheus and Alertmanager against the real exporter, and a webhook receiver here."""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import yaml
from dsaops.healthchecks.exporter import Config

from benchmarks.sglang_standin import log_lines as L
from tests.support.polling import wait_for
from tests.support.ports import free_port
from tests.support.prerequisites import need

REPO = Path(__file__).resolve().parents[2]
ALERTMANAGER = shutil.which("prometheus-alertmanager") or shutil.which("alertmanager")
MONITORING = yaml.safe_load((REPO / "playbooks/roles/monitoring/defaults/main.yml").read_text())  # the role's defaults


class Webhook:
    """Alertmanager's webhook receiver: keeps every notification posted to it."""

    def __init__(self):
        received = self.received = []

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                received.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/dsaops-alerts"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def alerts(self):
        return [a for note in self.received for a in note["alerts"]]

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture(scope="module")
def rendered(tmp_path_factory, promtool):
    """The monitoring role's stack tasks run by ansible-playbook on this machine (local connection,
    nothing started): prometheus.yml, alertmanager.yml and the installed rules under a prefix, in a
    folder Prometheus' and Alertmanager's users may enter (pytest's tmp_path is closed to them)."""
    tmp = Path(tempfile.mkdtemp(prefix="dsaops-monitoring-"))
    tmp.chmod(0o755)
    hook = Webhook()
    ports = {"exporter": free_port(), "alertmanager": free_port(), "server": free_port()}
    here = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}
    inventory = {"all": {"children": {
        "dsaops_cluster": {"children": {"dsaops_head": {"hosts": {"n1": {"ansible_host": "127.0.0.1"}}}}},
        "dsaops_monitoring": {"hosts": {"mon": here}}}}}
    (tmp / "inventory.yml").write_text(yaml.safe_dump(inventory))
    (tmp / "play.yml").write_text(yaml.safe_dump([{"name": "Render the monitoring stack", "hosts": "dsaops_monitoring",
                                                   "gather_facts": False, "tasks": [{
        "name": "Provision", "ansible.builtin.include_role": {"name": "monitoring", "tasks_from": "stack"}}]}]))
    extra = {"dsaops_root": str(tmp / "root"), "monitoring_start": "no", "monitoring_scrape_interval": "1s",
             "dsaops_exporter_port": ports["exporter"], "dsaops_server_port": ports["server"],
             "monitoring_alertmanager_port": ports["alertmanager"], "monitoring_alert_webhook_url": hook.url,
             "monitoring_alertmanager_route": {"group_by": ["alertname", "node"], "group_wait": "1s",
                                               "group_interval": "1s", "repeat_interval": "1h"},
             "monitoring_rules_glob": str(REPO / "healthchecks/rules/*.yml"),
             "monitoring_dashboards_glob": str(REPO / "healthchecks/dashboards/*.json"),
             "monitoring_dashboard_provider": str(REPO / "healthchecks/dashboards/provisioning/dashboards.yml")}
    env = {**os.environ, "ANSIBLE_ROLES_PATH": str(REPO / "playbooks/roles"), "ANSIBLE_NOCOLOR": "1",
           "ANSIBLE_HOME": str(tmp / "ansible"), "ANSIBLE_LOCAL_TEMP": str(tmp / "ansible-tmp"),
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    run = subprocess.run([str(Path(sys.executable).parent / "ansible-playbook"), "-i", str(tmp / "inventory.yml"),
                          str(tmp / "play.yml"), "-e", json.dumps(extra)], env=env, capture_output=True, text=True,
                         timeout=300, check=False)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    root = tmp / "root"
    yield {"prometheus": root / "etc/dsaops/prometheus/prometheus.yml",
           "token": (root / "etc/dsaops/prometheus/exporter-token").read_text().strip(),
           "alertmanager": root / "etc/dsaops/alertmanager/alertmanager.yml", "ports": ports, "hook": hook,
           "tmp": tmp, "root": root, "promtool": promtool}
    hook.close()
    shutil.rmtree(tmp)


def jobs(rendered) -> dict[str, dict]:
    return {job["job_name"]: job for job in yaml.safe_load(rendered["prometheus"].read_text())["scrape_configs"]}


def promtool_test(rendered, tmp_path, job: str, expect_fire: bool):
    """`promtool test rules` over the installed rules with `up` series of job `job`."""
    test = {"rule_files": [str(rendered["prometheus"].parent / "rules" / "*.yml")], "evaluation_interval": "15s",
            "tests": [{"interval": "15s",
                       "input_series": [{"series": f'up{{job="{job}",instance="n1:9860"}}', "values": "1x8 0x20"}],
                       "alert_rule_test": [{"eval_time": "5m", "alertname": "DsaExporterDown", "exp_alerts": [
                           {"exp_labels": {"severity": "warning", "job": job, "instance": "n1:9860"},
                            "exp_annotations": {"summary": "dsaops exporter n1:9860 cannot be scraped",
                                                "description": "Deaths, caps and host memory on that node are not "
                                                               "being watched."}}]
                           if expect_fire else []}]}]}
    path = tmp_path / "job_test.yml"
    path.write_text(yaml.safe_dump(test))
    return subprocess.run([rendered["promtool"], "test", "rules", str(path)], capture_output=True, text=True, timeout=60,
                          check=False)


def test_the_playbooks_scrape_job_is_the_one_the_rules_watch(rendered, tmp_path):
    found = jobs(rendered)
    exporter_jobs = [name for name, job in found.items() if any(
        f"127.0.0.1:{rendered['ports']['exporter']}" in t for c in job["static_configs"] for t in c["targets"])]
    assert len(exporter_jobs) == 1
    job = exporter_jobs[0]
    r = promtool_test(rendered, tmp_path, job, expect_fire=True)
    assert r.returncode == 0, r.stdout + r.stderr
    assert found[job]["honor_labels"] is True  # the series' own `node` label is kept
    # the token beside prometheus.yml, generated on the controller, Prometheus' user's alone
    assert found[job]["authorization"] == {"type": "Bearer", "credentials_file": "exporter-token"}
    token = rendered["prometheus"].parent / "exporter-token"
    generated = (rendered["tmp"] / "inventory.secrets" / "exporter-token").read_text().strip()
    assert token.read_text() == generated + "\n" and len(generated) == 40
    uid = MONITORING["monitoring_prometheus_uid"]
    assert (token.stat().st_mode & 0o777, token.stat().st_uid, token.stat().st_gid) == (0o400, uid, uid)


def test_negative_control_another_job_name_never_fires(rendered, tmp_path):
    r = promtool_test(rendered, tmp_path, "dsaops-exporter", expect_fire=True)  # the name the playbook once used
    assert r.returncode != 0 and "DsaExporterDown" in r.stdout + r.stderr


def test_an_alert_reaches_the_webhook(rendered, exporter_on, launcher, fake_server, tmp_path):
    need(ALERTMANAGER is not None, "Alertmanager (apt-get install prometheus-alertmanager)")
    need(shutil.which("prometheus") is not None, "Prometheus server (apt-get install prometheus)")
    log = tmp_path / "sglang.log"
    lch = launcher([f"sglang::scheduler_TP{i}" for i in range(2)], "--log", str(log))
    exp = exporter_on(Config(server_url=fake_server.url, node="n1", log_file=str(log), interval=1.0, kmsg=None),
                      rendered["ports"]["exporter"], token=rendered["token"])  # the token the play generated
    exp.watcher.scan_interval = 0.5
    # each as the role's uid for it, which no account has, as its container runs: it reads the files the
    # role gave it (alertmanager.yml, the scrape token: 0600 and 0400, its own) and writes its data folder
    alertmanager, prometheus = (MONITORING[f"monitoring_{name}_uid"] for name in ("alertmanager", "prometheus"))
    procs = []
    try:
        with open(tmp_path / "alertmanager.log", "w") as out:
            procs.append(subprocess.Popen([ALERTMANAGER, f"--config.file={rendered['alertmanager']}",
                                           f"--storage.path={rendered['root'] / 'var/lib/dsaops/alertmanager'}",
                                           "--cluster.listen-address=",
                                           f"--web.listen-address=127.0.0.1:{rendered['ports']['alertmanager']}"],
                                          stdout=out, stderr=subprocess.STDOUT, user=alertmanager, group=alertmanager,
                                          extra_groups=[], cwd="/"))
        prom_port = free_port()
        with open(tmp_path / "prometheus.log", "w") as out:
            procs.append(subprocess.Popen(["prometheus", f"--config.file={rendered['prometheus']}",
                                           f"--storage.tsdb.path={rendered['root'] / 'var/lib/dsaops/prometheus'}",
                                           "--log.level=warn", f"--web.listen-address=127.0.0.1:{prom_port}"],
                                          stdout=out, stderr=subprocess.STDOUT, user=prometheus, group=prometheus,
                                          extra_groups=[], cwd="/"))
        assert wait_for(lambda: sum(exp.watcher.snapshot()[0].values()) == 2, 10)

        def scraped_at_zero():  # the counter's first sample must be 0 for increase() to see the death
            url = f"http://127.0.0.1:{prom_port}/api/v1/query?query=dsa_worker_deaths_total%7Brank%3D%22TP1%22%7D"
            try:
                with urllib.request.urlopen(url, timeout=2) as r:
                    return bool(json.loads(r.read())["data"]["result"])
            except OSError:
                return False

        assert wait_for(scraped_at_zero, 30, 0.5), (tmp_path / "prometheus.log").read_text()[-2000:]
        victim = lch.pids[1]
        os.kill(victim, signal.SIGKILL)
        with open(log, "a") as f:
            f.write(L.line(L.crashed("scheduler_1", victim, -9)))

        def fired():
            return [a for a in rendered["hook"].alerts() if a["labels"]["alertname"] == "DsaWorkerRankDied"]

        assert wait_for(fired, 45, 0.5), ((tmp_path / "prometheus.log").read_text()[-2000:],
                                          (tmp_path / "alertmanager.log").read_text()[-2000:])
        alert = fired()[0]
        assert alert["status"] == "firing"
        assert {k: alert["labels"][k] for k in ("node", "rank", "cause", "severity")} == {
            "node": "n1", "rank": "TP1", "cause": "sigkill", "severity": "critical"}
        assert "Scheduler rank TP1 on n1 died (sigkill)" == alert["annotations"]["summary"]
    finally:
        for proc in procs:
            proc.terminate()
            proc.wait(10)
