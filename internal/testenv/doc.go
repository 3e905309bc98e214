// Package testenv starts real servers — redis-server, PostgreSQL and Prometheus — on free
// loopback ports with throwaway data directories, for the tests of every package and for
// the local demo stack. It can also stop, pause, resume and restart them for fault tests.
//
// It never mocks a server and never touches the system services on their standard ports.
// A missing binary is an error that names the Debian package to install; tests fail on it,
// they do not skip. It must not import any other package of this module.
package testenv
