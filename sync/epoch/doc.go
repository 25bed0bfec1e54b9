// Package epoch owns the vocabulary of the elastic layer's membership
// protocol: a World is one numbered, ordered member list (a world epoch) that
// every member agrees on before it runs collectives in it.
package epoch
