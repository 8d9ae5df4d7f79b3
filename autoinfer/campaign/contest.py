"""A contest file: several campaigns (typically one per engine: llama.cpp's tools and the reference engine) that
answer one question under one budget, so that one `autoinfer sweep` ranks all their configurations side by side.

Each contender is an ordinary campaign file and runs as its own study (its search, resume and confirmation are the
campaign's); the contest then re-measures every contender's best configurations interleaved in fresh processes and
recommends one of them (sweep/contest.py). Numbers from different campaigns are only comparable when they measure
the same thing under the same limits, so the contenders must agree on the objective, the prompt and generation
lengths and the memory constraints; a contest that mixes them is refused with the key that differs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import Field, ValidationError, model_validator

from autoinfer.campaign.spec import Campaign, Confirm, StrictModel, load_campaign, pydantic_message
from autoinfer.campaign.yaml_loader import load_yaml
from autoinfer.errors import UserError

#: What every contender must share for its numbers to be compared with the others'.
SHARED = {
    "objective": lambda c: c.objective,
    "measure.n_prompt": lambda c: c.measure.n_prompt,
    "measure.n_gen": lambda c: c.measure.n_gen,
    "serve.context": lambda c: c.serve.context,
    "constraints.vram_mib": lambda c: c.constraints.vram_mib,
    "constraints.ram_mib": lambda c: c.constraints.ram_mib,
}


class Contest(StrictModel):
    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
    contenders: list[str] = Field(min_length=2)  # campaign files, relative to the contest file
    finalists: int = Field(1, ge=1)  # each contender's best configurations that go to the final
    confirm: Confirm = Confirm()  # the final's interleaved rounds, test and tolerances
    source: str | None = None

    @model_validator(mode="after")
    def _valid(self) -> "Contest":
        if len(set(self.contenders)) != len(self.contenders):
            raise ValueError("a campaign file is listed twice; list each contender once")
        if "top_k" in self.confirm.model_fields_set:
            raise ValueError("confirm.top_k: every finalist runs in a contest's final; set `finalists:` (per "
                             "contender) instead")
        if not self.confirm.enabled:
            raise ValueError("confirm.enabled: a contest ranks its contenders by the interleaved final; drop it")
        return self

    def to_json(self) -> str:
        return self.model_dump_json()


def is_contest(data: Any) -> bool:
    """Whether a loaded YAML document is a contest (it lists contenders) rather than a campaign."""
    return isinstance(data, dict) and "contenders" in data


def parse_contest(data: dict[str, Any], source: str) -> Contest:
    try:
        return Contest.model_validate({**data, "source": source})
    except ValidationError as exc:
        raise UserError(f"{source}: {pydantic_message(exc)}") from None


def load_contest(path: Path, data: dict[str, Any] | None = None) -> tuple[Contest, list[Campaign]]:
    """The contest in `path` and its contenders' campaigns, checked to measure the same thing under one budget."""
    contest = parse_contest(load_yaml(path) if data is None else data, str(path))
    campaigns = []
    for entry in contest.contenders:
        file = (path.parent / entry).resolve() if not Path(entry).is_absolute() else Path(entry)
        document = load_yaml(file) if file.is_file() else None
        if is_contest(document):
            raise UserError(f"{path}: contender {entry} is itself a contest; list campaign files")
        campaigns.append(load_campaign(file, document))
    names = [c.name for c in campaigns]
    if len(set(names)) != len(names) or contest.name in names:
        raise UserError(f"{path}: the contenders' studies must have distinct names, other than the contest's "
                        f"({', '.join(names)}; contest {contest.name!r}); change the `name:` of one")
    first = campaigns[0]
    for key, value in SHARED.items():
        for other in campaigns[1:]:
            if value(other) != value(first):
                raise UserError(f"{path}: contenders {first.name!r} and {other.name!r} differ in {key} "
                                f"({value(first)!r} vs {value(other)!r}); their numbers would not be comparable — "
                                "set the same value in both campaign files")
    return contest, campaigns
