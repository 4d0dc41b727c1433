//! graceguard's executor core (in progress): see the guard section of DESIGN.md.
