"""HTTP routes: each validates, calls one service function and returns a schema."""
