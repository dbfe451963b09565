"""The ledger's two stores, one fixture: SQLite, and DynamoDB on moto's server."""

import pytest

from activities.ledger import DynamoLedger, SqliteLedger


@pytest.fixture(params=["sqlite", "dynamodb"])
def ledger(request, tmp_path):
    if request.param == "sqlite":
        return SqliteLedger(tmp_path / "ledger.db")
    ddb = request.getfixturevalue("aws")("dynamodb")
    DynamoLedger.create_table(ddb, "gpuheal-ledger")
    return DynamoLedger(ddb, "gpuheal-ledger")
