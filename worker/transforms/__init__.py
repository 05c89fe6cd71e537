"""Value transforms: reshape the converted columns before they are matched to the table (interface in
:mod:`worker.transforms.base`).

Importing this package registers the built-in transforms: :mod:`~worker.transforms.none`,
:mod:`~worker.transforms.flatten` and :mod:`~worker.transforms.debezium` (``flatten_debezium``). A new transform
is a new module here, imported below.
"""

from worker.transforms import debezium, flatten, none
from worker.transforms.base import REASON_TOMBSTONE, Columns, Reshaped, ValueTransform, register, value_transform

BUILT_IN = (none.NONE, flatten.FLATTEN, debezium.FLATTEN_DEBEZIUM)

__all__ = ["BUILT_IN", "REASON_TOMBSTONE", "Columns", "Reshaped", "ValueTransform", "register", "value_transform"]
