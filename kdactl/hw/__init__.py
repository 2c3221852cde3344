"""Hardware and external-program providers: small objects that tests replace with fakes."""
