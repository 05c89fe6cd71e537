"""Value transforms: reshape the converted columns before they are matched to the table (interface in
:mod:`worker.transforms.base`).

Importing this package registers the built-in transforms: :mod:`~worker.transforms.none`. A new transform
(``flatten``) is a new module here, imported below.
"""

from worker.transforms import none
from worker.transforms.base import Columns, ValueTransform, register, value_transform

BUILT_IN = (none.NONE,)

__all__ = ["BUILT_IN", "Columns", "ValueTransform", "register", "value_transform"]
