// Package inprocess serves a server.Server's services to callers in the
// same process: `mandate dev` wires its services together through it, and
// tests assemble topologies with it. A call stays in the process (no
// socket, no serialisation: messages are cloned) but runs through the
// server's own interceptors, so a service wired in process behaves as it
// does over the network.
//
// It is a package of its own, imported by the all-in-one binary and tests
// only, so that a service's own binary (cmd/mandate-<service>) does not
// link the in-process transport (grpchan and the protoreflect packages it
// needs) and idles with less of its binary mapped (issue #13).
package inprocess
