"""Value transforms: reshape the converted columns before they are matched to the table (interface in
:mod:`worker.transforms.base`).

Importing this package registers the built-in transforms: :mod:`~worker.transforms.none` and
:mod:`~worker.transforms.flatten`. A new transform is a new module here, imported below.
"""

from worker.transforms import flatten, none
from worker.transforms.base import Columns, Reshaped, ValueTransform, register, value_transform

BUILT_IN = (none.NONE, flatten.FLATTEN)

__all__ = ["BUILT_IN", "Columns", "Reshaped", "ValueTransform", "register", "value_transform"]
