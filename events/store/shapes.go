package store

import (
	"strings"

	"github.com/toolbus/toolbus"
)

// MaxKeyTokenLen bounds a key-safe token of a key a team writes (a call id, an instance
// name or boot, a secret's name, each as kvSafe writes it): an id of 128 bytes, every
// byte of it escaped.
const MaxKeyTokenLen = 3 * 128

// TeamKeyShape reports whether key has the shape of a key toolbus itself writes in
// bucket for team: ClaimKey and slotKey in the claims, OutputKey's chunks and meta (an
// attachment's too) in the outputs, a tool's name in the catalog, InstanceKey and
// SecretKey of the team in the instances and secrets. Every token is checked: a tool
// name and a run id as the contract bounds them, a step or index in digits, a key-safe
// token within MaxKeyTokenLen. The core's write service (package intake) refuses any
// other key, so that a team writes no key the readers do not expect and no subject
// longer than its parts allow.
func TeamKeyShape(bucket, team, key string) bool {
	t := strings.Split(key, ".")
	switch bucket {
	case BucketTools:
		return len(t) == 1 && toolbus.ValidToolName(t[0])
	case BucketClaims:
		return len(t) == 4 && toolbus.ValidToolName(t[0]) && toolbus.ValidRunID(t[1]) &&
			(digits(t[2]) && safeToken(t[3]) || t[2] == "slot" && digits(t[3]))
	case BucketOutputs:
		if len(t) == 6 {
			// An attachment: <tool>.<run>.<step>.<call>.a<i>.<chunk|meta>.
			if !strings.HasPrefix(t[4], "a") || !digits(t[4][1:]) {
				return false
			}
			t = append(t[:4], t[5])
		}
		return len(t) == 5 && toolbus.ValidToolName(t[0]) && toolbus.ValidRunID(t[1]) && digits(t[2]) &&
			safeToken(t[3]) && (digits(t[4]) || t[4] == "meta")
	case BucketInstances:
		return len(t) == 3 && t[0] == team && safeToken(t[1]) && safeToken(t[2])
	case BucketSecrets:
		return len(t) == 2 && t[0] == team && safeToken(t[1])
	}
	return false
}

// digits reports whether s is 1 to 10 decimal digits (a step, a chunk, an index).
func digits(s string) bool {
	if len(s) == 0 || len(s) > 10 {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}

// safeToken reports whether s is a token kvSafe can write, within MaxKeyTokenLen.
func safeToken(s string) bool {
	if len(s) == 0 || len(s) > MaxKeyTokenLen {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; !toolbus.TokenByte(c) && c != '=' {
			return false
		}
	}
	return true
}
