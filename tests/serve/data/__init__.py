"""Test data of the serve tests (see README.md here): TEI's OpenAPI document, with its source."""
