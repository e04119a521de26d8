"""The test suite: a folder per package of src/implicitlm (cli, core, data, ...), the
repository as a whole in project/, and the helpers and files the tests share in support/."""
