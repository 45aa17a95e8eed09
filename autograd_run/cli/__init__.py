"""The ``autograd-run`` command line (click): parse, call the library, render with rich."""
