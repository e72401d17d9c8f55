"""`files` page tokens name their table: a token of one table's listing used for another
was caught only when the item counts differed (MANIFEST_CONFLICT, and the client listed again
in vain); with equal counts it was read at the other table's offsets. Now it is BAD_REQUEST.
Stub nodes, nothing started (as test_txn_log_paging_lagging)."""

from __future__ import annotations

import pytest

from metastore.commands import TableName
from metastore.errors import BadRequestError
from tests.daemon.lagging_node import call, stub_api
from tests.metastore.test_txn import commit, ready, tick, write
from tests.metastore.test_txn import ok as ok_commit


def test_a_files_token_used_on_another_table_is_a_bad_request() -> None:
    d = ready()
    b = TableName.parse("ns.b")
    for i in range(3):  # as many files in both: the item count check cannot tell them apart
        ok_commit(d, commit(f"w:{i}", write(add=(f"a{i}",)), write(b, add=(f"b{i}",))))
    tick(d, 1)
    state = d.state
    api, _ = stub_api(state, state)
    first = call(api, "files", {"table": "ns.a", "limit": 1})
    token = first["next_page_token"]
    again = call(api, "files", {"table": "ns.a", "limit": 1, "page_token": token})
    assert again["files"] and again["files"] != first["files"]
    with pytest.raises(BadRequestError, match=r"not of ns\.b"):
        call(api, "files", {"table": "ns.b", "limit": 1, "page_token": token})
    multi = call(api, "files_multi", {"tables": ["ns.a", "ns.b"], "limit": 1})
    multi_token = multi["listings"][0]["next_page_token"]
    with pytest.raises(BadRequestError):
        call(api, "files", {"table": "ns.b", "limit": 1, "page_token": multi_token})
    # A token of the previous release (no table id) still works on its own table.
    old = ":".join(token.split(":")[:3])
    again = call(api, "files", {"table": "ns.a", "limit": 1, "page_token": old})
    new = call(api, "files", {"table": "ns.a", "limit": 1, "page_token": token})
    assert again["files"] == new["files"]
