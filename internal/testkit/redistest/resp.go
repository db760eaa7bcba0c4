package redistest

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"time"
)

// ErrNil is returned by Do for a nil reply, such as GET of a missing key.
var ErrNil = errors.New("redistest: nil reply")

// ReplyError is an error reply from the server, such as "MOVED 3999 127.0.0.1:7002".
type ReplyError string

func (e ReplyError) Error() string { return "redis: " + string(e) }

// ioTimeout bounds one Do or PING round trip, so a wedged server fails a test instead of
// hanging it.
const ioTimeout = 5 * time.Second

// Do sends one command on a fresh connection and returns the reply as a string: the text of a
// simple string or bulk string, the decimal form of an integer. A nil reply gives ErrNil, an
// error reply a ReplyError, an array its elements one per line (nested ones flattened): this is
// for setting up and checking servers, not a client library. Each call is a new connection, so per-connection
// state (SELECT, MULTI, the offset WAIT waits for) does not carry from one call to the next.
func (s *Server) Do(args ...string) (string, error) {
	replies, errs, err := pipeline(s.Addr, args)
	if err != nil {
		return "", err
	}
	return replies[0], errs[0]
}

// pipeline sends cmds on one connection and reads one reply per command: replies[i] and
// errs[i] are what Do would return for cmds[i]. err is a connection or protocol failure, after
// which the replies are incomplete.
func pipeline(addr string, cmds ...[]string) (replies []string, errs []error, err error) {
	conn, err := net.DialTimeout("tcp", addr, ioTimeout)
	if err != nil {
		return nil, nil, err
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(ioTimeout))
	// Sent as RESP arrays of bulk strings, so arguments may hold spaces and CRLF.
	var b strings.Builder
	for _, args := range cmds {
		fmt.Fprintf(&b, "*%d\r\n", len(args))
		for _, a := range args {
			fmt.Fprintf(&b, "$%d\r\n%s\r\n", len(a), a)
		}
	}
	if _, err := io.WriteString(conn, b.String()); err != nil {
		return nil, nil, err
	}
	r := bufio.NewReader(conn)
	for range cmds {
		reply, err := readReply(r)
		var re ReplyError
		if err != nil && !errors.Is(err, ErrNil) && !errors.As(err, &re) {
			return replies, errs, err
		}
		replies, errs = append(replies, reply), append(errs, err)
	}
	return replies, errs, nil
}

func readReply(r *bufio.Reader) (string, error) {
	line, err := readLine(r)
	if err != nil {
		return "", err
	}
	if line == "" {
		return "", errors.New("redistest: empty reply line")
	}
	switch body := line[1:]; line[0] {
	case '+', ':':
		return body, nil
	case '-':
		return "", ReplyError(body)
	case '$':
		n, err := strconv.Atoi(body)
		if err != nil {
			return "", fmt.Errorf("redistest: bad bulk length %q", body)
		}
		if n < 0 {
			return "", ErrNil
		}
		buf := make([]byte, n+2) // payload and CRLF
		if _, err := io.ReadFull(r, buf); err != nil {
			return "", err
		}
		return string(buf[:n]), nil
	case '*':
		n, err := strconv.Atoi(body)
		if err != nil {
			return "", fmt.Errorf("redistest: bad array length %q", body)
		}
		if n < 0 {
			return "", ErrNil
		}
		// An array is its elements one per line (nested ones flattened): enough for lists of
		// keys and names.
		elems := make([]string, 0, n)
		for range n {
			e, err := readReply(r)
			if err != nil && !errors.Is(err, ErrNil) {
				return "", err
			}
			elems = append(elems, e)
		}
		return strings.Join(elems, "\n"), nil
	default:
		return "", fmt.Errorf("redistest: unexpected reply %q", line)
	}
}

func readLine(r *bufio.Reader) (string, error) {
	line, err := r.ReadString('\n')
	if err != nil {
		return "", err
	}
	return strings.TrimSuffix(strings.TrimSuffix(line, "\n"), "\r"), nil
}

// ping sends the inline command PING, which every Redis accepts before any handshake, and
// expects +PONG.
func ping(addr string) error {
	conn, err := net.DialTimeout("tcp", addr, 200*time.Millisecond)
	if err != nil {
		return err
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(time.Second))
	if _, err := io.WriteString(conn, "PING\r\n"); err != nil {
		return err
	}
	line, err := readLine(bufio.NewReader(conn))
	if err != nil {
		return err
	}
	if line != "+PONG" {
		return fmt.Errorf("PING: got %q", line)
	}
	return nil
}

// InfoFields parses the "key:value" lines of INFO and CLUSTER INFO.
func InfoFields(s string) map[string]string {
	m := map[string]string{}
	for _, line := range strings.Split(s, "\n") {
		k, v, ok := strings.Cut(strings.TrimSpace(line), ":")
		if ok {
			m[k] = v
		}
	}
	return m
}
