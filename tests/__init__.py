"""bertforge's tests: a package, so that every test directory imports the shared helpers the same way
(`from tests.helpers import ...`)."""
