"""Which MLflow tracking stores a `tracking.uri` can name: checked with the config, before any
command does work (a cell trained with a URI no store accepts would leave its result pending
for ever)."""

from __future__ import annotations

# Schemes MLflow's tracking client can open (its registry; plugins may add more, which a user
# of a plugin names in tracking.uri and this check lets through when the plugin is installed).
BUILTIN_SCHEMES = (
    "sqlite",
    "mysql",
    "postgresql",
    "mssql",
    "http",
    "https",
    "file",
    "databricks",
    "databricks-uc",
    "uc",
)
ALLOWED_STORES = (
    "http(s)://host:port, sqlite:///path/mlflow.db, a directory path, "
    "or a database URI (postgresql://, mysql://)"
)


def store_scheme(uri: str) -> str:
    """The scheme of `uri` ("file" for a plain path)."""
    return uri.partition("://")[0] if "://" in uri else "file"


def known_scheme(scheme: str) -> bool:
    """Whether MLflow, or an installed MLflow plugin, has a tracking store for `scheme`."""
    if scheme in BUILTIN_SCHEMES:
        return True
    from importlib.metadata import entry_points

    return any(entry.name == scheme for entry in entry_points(group="mlflow.tracking_store"))
