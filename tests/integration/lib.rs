//! Nothing here: the tests live in `tests/`, built as one binary.
