// Package arch holds the architecture test: it reads the dependency map of
// docs/architecture.md (which packages of this module each package may import, and
// which packages must not reach which modules even indirectly) and checks it against
// `go list -deps -json ./...`. It has no code of its own; its test reads the tables as
// generated sections (internal/gendoc).
package arch
