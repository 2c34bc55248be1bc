// The source of cohort_test_pch (tests/CMakeLists.txt): the target exists to
// build the tests' precompiled header, which needs a translation unit.
