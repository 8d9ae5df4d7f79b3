"""Only autoinfer/store/ reads or writes what Optuna keeps beside a trial's parameters and values (user and system
attributes, queued and hand-made trials, Optuna's private storage API): everything else gets TrialRecords and
StudyRecords from the Store and writes through it."""

from __future__ import annotations

import re
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "autoinfer"
STORE_ONLY = re.compile(r"user_attr|system_attr|\benqueue_trial\(|\bcreate_trial\b|optuna\.storages\._|\._storage\b")


def outside_the_store(package: Path) -> list[str]:
    return [f"{path.relative_to(package.parent)}:{number}: {line.strip()}"
            for path in sorted(package.rglob("*.py")) if path.relative_to(package).parts[0] != "store"
            for number, line in enumerate(path.read_text().splitlines(), 1) if STORE_ONLY.search(line)]


def test_only_the_store_touches_optuna_attributes():
    found = outside_the_store(PACKAGE)
    assert not found, "\n".join(found)


def test_user_attributes_are_read_and_written_in_one_module():
    """Inside store/, too, only the Store's module (store/trials.py) touches them: the records only decode them."""
    found = [f"{path.relative_to(PACKAGE.parent)}:{number}: {line.strip()}"
             for path in sorted(PACKAGE.rglob("*.py")) if path.relative_to(PACKAGE).as_posix() != "store/trials.py"
             for number, line in enumerate(path.read_text().splitlines(), 1) if "user_attr" in line]
    assert not found, "\n".join(found)


def test_the_check_sees_each_way_of_touching_them(tmp_path):
    package = tmp_path / "pkg"
    (package / "store").mkdir(parents=True)
    (package / "store" / "trials.py").write_text("trial.set_user_attr('outcome', 'ok')\n")
    (package / "loop.py").write_text("\n".join([
        "x = t.user_attrs['config']", "study.set_user_attr('drift', {})", "study.enqueue_trial(p, user_attrs={})",
        "optuna.trial.create_trial(state=s)", "t.system_attrs['fixed_params']",
        "from optuna.storages._heartbeat import BaseHeartbeatThread", "study._storage.get_trial(1)",
        "record.outcome", "Store(study).enqueue(p, label='x')"]) + "\n")
    assert [line.split(":")[1] for line in outside_the_store(package)] == [str(n) for n in range(1, 8)]
