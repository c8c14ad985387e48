"""The kinds of value ddlstudy's file formats hold (``records.formats``,
``records.advice``): counts, rates, names, byte counts, each with its range."""

from __future__ import annotations

from typing import Annotated

from pydantic import AfterValidator as After
from pydantic import BaseModel, Field

from ddlstudy.config.schema import RECORDED, finite

NAME = r"[A-Za-z0-9][A-Za-z0-9._+-]*"
"""A run id, study name or cell id: the name of a folder, never a path."""


Count = Annotated[int, Field(ge=0, le=10**12)]
Positive = Annotated[int, Field(ge=1, le=10**9)]
Seconds = Annotated[float, Field(ge=0), After(finite)]
Rate = Annotated[float, Field(gt=0), After(finite)]
Ratio = Annotated[float, Field(ge=0), After(finite)]
Fraction = Annotated[float, Field(ge=0, le=1)]
Loss = float  # a diverged run records nan: still a run
Name = Annotated[str, Field(pattern=rf"^{NAME}$", max_length=255)]  # Rust regex: $ is the end
Text = Annotated[str, Field(min_length=1, max_length=4096)]
Sha256 = Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]
Pid = Annotated[int, Field(ge=1, lt=2**31)]


class Record(BaseModel):
    model_config = RECORDED


Bytes = Annotated[int, Field(ge=0, le=2**60)]
Error = Annotated[float, After(finite)]
"""(predicted - measured) / measured: +0.10 predicted 10 % more than measured."""
