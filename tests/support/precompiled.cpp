// The translation unit that builds the test programs' shared precompiled header
// (strata_test_pch in tests/CMakeLists.txt); it has no code of its own.
