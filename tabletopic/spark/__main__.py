"""The Spark side process's child: ``python -m tabletopic.spark FD`` (:func:`tabletopic.spark.service.child_main`)."""

import sys

from tabletopic.spark.service import child_main

sys.exit(child_main(sys.argv[1:]))
