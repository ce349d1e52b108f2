"""``budgets.yaml``, next to routes.yaml: usage budgets an admin keeps apart from pluto.yaml —
the file the console's budgets page edits (``PUT /admin/usage/budgets/file``). Its budgets
count along with ``usage.budgets`` of pluto.yaml; a bad edit is refused with file and line and
the last good budgets keep applying (the config watcher reads it like routes.yaml).

```yaml
budgets:
  - {per: user, period: day, tokens: 200000}
  - {per: agent, only: analyst, period: month, cost: 50}
```
"""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from pluto.errors import ConfigError
from pluto.settings import Budget
from pluto.yamldoc import YamlDoc

FILE = "budgets.yaml"


class BudgetsFile(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    budgets: list[Budget] = Field(default_factory=list)


def load_budgets(config_dir: Path) -> list[Budget]:
    """The file's budgets ([] without the file); a ConfigError naming file and line."""
    path = config_dir / FILE
    if not path.exists():
        return []
    doc = YamlDoc(path)
    if doc.data is not None and not isinstance(doc.data, dict):
        raise ConfigError([(doc.name, 1, "", "expected 'budgets:' (a list)")])
    return list(doc.validate(BudgetsFile).budgets)
