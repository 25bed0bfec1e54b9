package gossipforge

import (
	"bytes"
	"context"
	"crypto/aes"
	"crypto/cipher"
	"crypto/hkdf"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"time"

	"github.com/hashicorp/go-msgpack/v2/codec"
)

// Message types of memberlist's protocol (net.go's messageType: the numbers
// are the protocol).
const (
	typeSuspect  = 3
	typeAlive    = 4
	typeDead     = 5
	typePushPull = 6
	typeEncrypt  = 10
)

// State is a node's state in a push/pull exchange (memberlist's
// NodeStateType).
type State int

const (
	StateAlive   State = 0
	StateSuspect State = 1
	StateDead    State = 2
	StateLeft    State = 3
)

// Versions is what a member of this module's memberlist advertises:
// protocol min, max and current, then the delegate's (none).
var Versions = []uint8{1, 5, 2, 0, 0, 0}

// Suspect says From suspects Node at Incarnation.
type Suspect struct {
	Incarnation uint32
	Node        string
	From        string
}

// Dead says From found Node dead at Incarnation (From == Node: Node left).
type Dead struct {
	Incarnation uint32
	Node        string
	From        string
}

// Alive says Node is alive at Incarnation, at Addr:Port, with metadata Meta.
type Alive struct {
	Incarnation uint32
	Node        string
	Addr        []byte
	Port        uint16
	Meta        []byte
	Vsn         []uint8
}

// NodeState is one node in a push/pull exchange.
type NodeState struct {
	Name        string
	Addr        []byte
	Port        uint16
	Meta        []byte
	Incarnation uint32
	State       State
	Vsn         []uint8
}

type pushPullHeader struct {
	Nodes        int
	UserStateLen int
	Join         bool
}

// GossipKey derives the gossip key from a job secret as package membership
// does (an insider holds the secret, so it can; membership's tests check
// that the two agree).
func GossipKey(secret []byte) ([]byte, error) {
	return hkdf.Key(sha256.New, secret, []byte("gorovod membership"), "memberlist gossip AES-256-GCM key v1", 32)
}

func appendMsgpack(b []byte, v any) ([]byte, error) {
	buf := bytes.NewBuffer(b)
	if err := codec.NewEncoder(buf, &codec.MsgpackHandle{}).Encode(v); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// Message is one message's plaintext: its type byte and MessagePack body.
func Message(v any) ([]byte, error) {
	var typ byte
	switch v.(type) {
	case Suspect, *Suspect:
		typ = typeSuspect
	case Alive, *Alive:
		typ = typeAlive
	case Dead, *Dead:
		typ = typeDead
	default:
		return nil, fmt.Errorf("gossipforge: no message type for %T", v)
	}
	return appendMsgpack([]byte{typ}, v)
}

// seal encrypts plain with key as memberlist's encryption version 1:
// version, nonce, then AES-GCM's ciphertext and tag over plain, with aad.
func seal(key, plain, aad []byte) ([]byte, error) {
	block, err := aes.NewCipher(key)
	if err != nil {
		return nil, err
	}
	gcm, err := cipher.NewGCM(block)
	if err != nil {
		return nil, err
	}
	out := make([]byte, 1+gcm.NonceSize(), 1+gcm.NonceSize()+len(plain)+gcm.Overhead())
	out[0] = 1
	if _, err := rand.Read(out[1:]); err != nil {
		return nil, err
	}
	return gcm.Seal(out, out[1:], plain, aad), nil
}

// Packet is msg as a UDP packet: sealed with key, or in clear when key is nil.
func Packet(key, msg []byte) ([]byte, error) {
	if key == nil {
		return msg, nil
	}
	return seal(key, msg, nil)
}

// SendPacket sends packet to a member's gossip address over UDP.
func SendPacket(to netip.AddrPort, packet []byte) error {
	c, err := net.DialUDP("udp", nil, net.UDPAddrFromAddrPort(to))
	if err != nil {
		return err
	}
	defer c.Close()
	_, err = c.Write(packet)
	return err
}

// MessagePacket is message v (Message) as a UDP packet sealed with key
// (Packet).
func MessagePacket(key []byte, v any) ([]byte, error) {
	msg, err := Message(v)
	if err != nil {
		return nil, err
	}
	return Packet(key, msg)
}

// SendMessage sends message v, sealed with key, to a member's gossip
// address over UDP.
func SendMessage(to netip.AddrPort, key []byte, v any) error {
	p, err := MessagePacket(key, v)
	if err != nil {
		return err
	}
	return SendPacket(to, p)
}

// PushPull is a push/pull request carrying nodes (join marks it a join, which
// memberlist hands its merge delegate first), as a stream message sealed
// with key, or in clear when key is nil.
func PushPull(key []byte, join bool, nodes []NodeState) ([]byte, error) {
	plain, err := appendMsgpack([]byte{typePushPull}, pushPullHeader{Nodes: len(nodes), Join: join})
	if err != nil {
		return nil, err
	}
	for i := range nodes {
		if plain, err = appendMsgpack(plain, &nodes[i]); err != nil {
			return nil, err
		}
	}
	if key == nil {
		return plain, nil
	}
	head := make([]byte, 5, 5+1+12+len(plain)+16)
	head[0] = typeEncrypt
	binary.BigEndian.PutUint32(head[1:], uint32(1+12+len(plain)+16))
	body, err := seal(key, plain, head)
	if err != nil {
		return nil, err
	}
	return append(head, body...), nil
}

// Exchange writes a stream message to a member's gossip address over TCP and
// reads whatever it answers until it closes the stream, ctx ends or timeout
// passes. A member that accepts a push/pull sends its own state before
// merging ours: a sender that hung up at once would have it fail that write
// and never merge. It returns the answer's length: 0 when the member refused
// the request (it closes the stream without a word, or after an error
// message for a stream it could not read).
func Exchange(ctx context.Context, to netip.AddrPort, stream []byte, timeout time.Duration) (int, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", to.String())
	if err != nil {
		return 0, err
	}
	defer c.Close()
	if dl, ok := ctx.Deadline(); ok {
		_ = c.SetDeadline(dl)
	}
	if _, err := c.Write(stream); err != nil {
		return 0, err
	}
	n, err := io.Copy(io.Discard, c)
	if err != nil && !errors.Is(err, io.EOF) {
		return int(n), err
	}
	return int(n), nil
}
