"""system_info: one row of machine facts, shown by the report's System section; no
graph, and no distribution worth summarising."""

from __future__ import annotations

from kernmlops.graphs.base import TableView


class SystemInfoView(TableView):
    name = "system_info"
    tgid_column = None
    key_columns = ()
