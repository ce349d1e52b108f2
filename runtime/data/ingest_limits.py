"""What loading a file may cost, and how to read a CSV: plain settings, no DuckDB (the gateway
builds them at start-up without importing it)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class CsvOptions:
    """How to read a CSV or TSV file; None: detected (nulls: NA, N/A, NULL and empty)."""

    nulls: tuple[str, ...] | None = None
    delimiter: str | None = None
    header: bool | None = None
    types: dict[str, str] = field(default_factory=dict)

    def as_json(self) -> dict[str, object]:
        return {"nulls": list(self.nulls) if self.nulls is not None else None,
                "delimiter": self.delimiter, "header": self.header, "types": self.types}


@dataclass(frozen=True, slots=True)
class IngestLimits:
    """What loading one file may cost (the child is stopped or the file refused beyond)."""

    memory_limit: str = "1GB"
    threads: int = 2
    timeout: float = 600.0  # seconds
    max_rows: int = 100_000_000
    max_columns: int = 2_000
    max_file_bytes: int = 20 * 2**30  # the dataset file written
