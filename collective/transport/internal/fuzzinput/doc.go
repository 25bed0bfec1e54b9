// Package fuzzinput hands out fixed-size values from a fuzzer's input, for
// the transport's fuzz tests, which build well-formed messages from
// arbitrary bytes to check that each survives an encode/decode round trip.
package fuzzinput
