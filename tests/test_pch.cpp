// The one file of dpcheck_test_pch (tests/CMakeLists.txt), the program that precompiles the test
// programs' shared headers, with the flags and definitions that every test program has and no more.
