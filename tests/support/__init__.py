"""What the tests share: helpers and fixtures' makers, never tests."""
