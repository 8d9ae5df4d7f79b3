"""The notebooks run top to bottom (nbclient) and print numbers computed from the data."""

from __future__ import annotations

from pathlib import Path

import nbformat
import optuna
from nbclient import NotebookClient

from autoinfer.analysis.dataset import add_to_study
from autoinfer.analysis.importers import read_file
from autoinfer.store.trials import storage_for

NOTEBOOKS = Path(__file__).resolve().parents[2] / "notebooks"


def _run(name: str) -> str:
    nb = nbformat.read(NOTEBOOKS / name, as_version=4)
    NotebookClient(nb, timeout=180, kernel_name="python3", resources={"metadata": {"path": str(NOTEBOOKS)}}).execute()
    return "\n".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.outputs
                     if o.output_type == "stream")


def test_seed_reanalysis_notebook(monkeypatch, peer):
    monkeypatch.setenv("AUTOINFER_PEER_DATA", str(peer))
    text = _run("seed-reanalysis.ipynb")
    assert "17 replicates: max 29.899, median 29.124" in text
    assert "mean 28.67" in text
    assert "12.331 tok/s is one row: results_phase10.tsv line 3" in text
    assert "two-point solve here: alpha = 4.247 (M = 42 fixed)" in text
    assert "- Not supported: a specific exponent." in text


def test_campaign_notebook(placement_csv, tmp_path, monkeypatch):
    storage = f"sqlite:///{tmp_path / 'db.sqlite'}"
    study = optuna.create_study(study_name="nb", storage=storage_for(storage), direction="maximize")
    add_to_study([read_file(placement_csv)], study)
    monkeypatch.setenv("AUTOINFER_STUDY", "nb")
    monkeypatch.setenv("AUTOINFER_STORAGE", storage)
    monkeypatch.setenv("AUTOINFER_REPORT_DIR", str(tmp_path / "report"))
    text = _run("campaign.ipynb")
    assert f"study nb: {len(study.trials)} trials" in text
    assert "The bandwidth model explains the speeds best by AICc" in text
    assert (tmp_path / "report" / "report.html").exists()
