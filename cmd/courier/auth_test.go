package main

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"

	"github.com/courierhq/courier/internal/natstest"
	"github.com/courierhq/courier/internal/poll"
)

// Connection security: each way of authenticating (and TLS) against an
// embedded server that requires it. The right secret delivers a message; a
// wrong one is one line, exit status 1, quickly, and names no secret.

// authCase is a server that requires something, and the environments that
// do and do not satisfy it.
type authCase struct {
	name string
	// configure sets up the server; client connects the test's own client.
	configure func(*server.Options)
	client    []nats.Option
	// good and bad are courier's NATS_* variables (K=V).
	good, bad []string
	// secrets must appear nowhere in courier's output, good or bad.
	secrets []string
	// wantErr is a word the bad case's error must contain.
	wantErr string
}

func TestAuthMethods(t *testing.T) {
	for _, tc := range authCases(t) {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel() // each case has its own server
			h := newSecureHarness(t, natstest.Options{Configure: tc.configure}, tc.client...)

			t.Run("right secret delivers", func(t *testing.T) {
				a := newApp(t, nil)
				c := start(t, h.env(a.URL, tc.good...))
				h.publish("orders.auth", "hello "+tc.name, nil)
				poll.Until(t, 15*time.Second, "the message delivered", func() bool { return a.count() >= 1 })
				poll.Until(t, 15*time.Second, "the message acked", func() bool { return h.settled("courier") })
				if err := c.stop(); err != nil {
					t.Fatalf("courier stopped with %v\nlogs:\n%s", err, c.logs.String())
				}
				if got := a.requests()[0].Body; got != "hello "+tc.name {
					t.Errorf("app got %q", got)
				}
				assertNoSecrets(t, c.logs.String(), tc.secrets)
			})

			t.Run("wrong secret fails clearly", func(t *testing.T) {
				out, code := runUntilExit(t, h.env("http://127.0.0.1:1/", tc.bad...), 15*time.Second)
				if code != 1 {
					t.Errorf("exit status %d, want 1\n%s", code, out.all())
				}
				line := strings.TrimSuffix(out.stderrLine, "\n")
				if line == "" || strings.Contains(line, "\n") {
					t.Errorf("want one line on stderr, got %q", out.stderrLine)
				}
				if !strings.Contains(strings.ToLower(line), tc.wantErr) {
					t.Errorf("error %q does not mention %q", line, tc.wantErr)
				}
				for _, bad := range []string{"goroutine ", "panic", ".go:"} {
					if strings.Contains(out.all(), bad) {
						t.Errorf("output contains %q (a stack trace?):\n%s", bad, out.all())
					}
				}
				assertNoSecrets(t, out.all(), tc.secrets)
			})
		})
	}
}

func authCases(t *testing.T) []authCase {
	const (
		token    = "tok-Zq8vR2mYwL5xN3pK"
		badToken = "tok-WRONG-Hh7sJ4dF0a"
		pass     = "pw-Xj4kT9qLm2Vb7Rc1"
		badPass  = "pw-WRONG-Gg5nQ8wE3z"
	)
	dir := t.TempDir()

	// NKey: a user whose public key the server knows, and one it does not.
	nkUser, nkSeed := newNKeyUser(t)
	_, nkOtherSeed := newNKeyUser(t)
	nkFile := writeFile(t, dir, "user.nk", nkSeed)
	nkOtherFile := writeFile(t, dir, "other.nk", nkOtherSeed)

	// JWT: an operator trusting an account; a user of that account, and a
	// user of an account from another operator.
	op := newOperator(t)
	goodCreds, goodSecrets := op.userCreds(t, op.account)
	stranger := newOperator(t)
	badCreds, badSecrets := stranger.userCreds(t, stranger.account)
	goodCredsFile := writeFile(t, dir, "user.creds", goodCreds)
	badCredsFile := writeFile(t, dir, "other.creds", badCreds)

	// TLS: a CA that signed the server and a client; another CA that
	// signed nothing the server trusts.
	pki := newPKI(t, dir, "ca")
	otherPKI := newPKI(t, dir, "other-ca")

	return []authCase{
		{
			name:      "Token",
			configure: func(o *server.Options) { o.Authorization = token },
			client:    []nats.Option{nats.Token(token)},
			good:      []string{"NATS_TOKEN=" + token},
			bad:       []string{"NATS_TOKEN=" + badToken},
			secrets:   []string{token, badToken},
			wantErr:   "authorization",
		},
		{
			name:      "UserPassword",
			configure: func(o *server.Options) { o.Username, o.Password = "orders", pass },
			client:    []nats.Option{nats.UserInfo("orders", pass)},
			good:      []string{"NATS_USER=orders", "NATS_PASSWORD=" + pass},
			bad:       []string{"NATS_USER=orders", "NATS_PASSWORD=" + badPass},
			secrets:   []string{pass, badPass},
			wantErr:   "authorization",
		},
		{
			name:      "NKey",
			configure: func(o *server.Options) { o.Nkeys = []*server.NkeyUser{{Nkey: nkUser}} },
			client:    []nats.Option{nkeyOption(t, nkFile)},
			good:      []string{"NATS_NKEY=" + nkFile},
			bad:       []string{"NATS_NKEY=" + nkOtherFile},
			secrets:   []string{nkSeed, nkOtherSeed},
			wantErr:   "authorization",
		},
		{
			name:      "Creds",
			configure: op.configure,
			client:    []nats.Option{nats.UserCredentials(goodCredsFile)},
			good:      []string{"NATS_CREDS=" + goodCredsFile},
			bad:       []string{"NATS_CREDS=" + badCredsFile},
			secrets:   append(goodSecrets, badSecrets...),
			wantErr:   "authorization",
		},
		{
			name:      "TLSCustomCA",
			configure: pki.serverTLS(t, false),
			client:    []nats.Option{nats.RootCAs(pki.caFile)},
			good:      []string{"NATS_CA=" + pki.caFile},
			bad:       []string{"NATS_CA=" + otherPKI.caFile},
			wantErr:   "tls",
		},
		{
			name:      "MutualTLS",
			configure: pki.serverTLS(t, true),
			client:    []nats.Option{nats.RootCAs(pki.caFile), nats.ClientCert(pki.clientCert, pki.clientKey)},
			good:      []string{"NATS_CA=" + pki.caFile, "NATS_CERT=" + pki.clientCert, "NATS_KEY=" + pki.clientKey},
			// A client certificate the server's CA did not sign.
			bad:     []string{"NATS_CA=" + pki.caFile, "NATS_CERT=" + otherPKI.clientCert, "NATS_KEY=" + otherPKI.clientKey},
			secrets: []string{pki.clientKeyPEM, otherPKI.clientKeyPEM},
			wantErr: "tls",
		},
		{
			name:      "MutualTLSNoClientCert",
			configure: pki.serverTLS(t, true),
			client:    []nats.Option{nats.RootCAs(pki.caFile), nats.ClientCert(pki.clientCert, pki.clientKey)},
			good:      []string{"NATS_CA=" + pki.caFile, "NATS_CERT=" + pki.clientCert, "NATS_KEY=" + pki.clientKey},
			bad:       []string{"NATS_CA=" + pki.caFile},
			wantErr:   "tls",
		},
	}
}

// newSecureHarness is newHarness for a server that requires authentication
// or TLS: o configures it, and clientOpts let the test's own client in.
func newSecureHarness(t *testing.T, o natstest.Options, clientOpts ...nats.Option) *harness {
	t.Helper()
	h := &harness{t: t, stream: "ORDERS", dir: t.TempDir()}
	h.srv = natstest.Start(t, o)
	h.nc, h.js = connectWith(t, h.srv, clientOpts...)
	createStream(t, h)
	return h
}

// connectWith is natstest.Connect with client options.
func connectWith(t *testing.T, srv *server.Server, opts ...nats.Option) (*nats.Conn, jetstream.JetStream) {
	t.Helper()
	nc, err := nats.Connect(srv.ClientURL(), opts...)
	if err != nil {
		t.Fatalf("test client connect: %v", err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return nc, js
}

// createStream creates h.stream on orders.>, as newHarness does.
func createStream(t *testing.T, h *harness) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := h.js.CreateStream(ctx, jetstream.StreamConfig{Name: h.stream, Subjects: []string{"orders.>"}}); err != nil {
		t.Fatalf("create stream: %v", err)
	}
}

// runOutput is what one run of courier printed.
type runOutput struct {
	logs       string // run's stderr: the sidecar's log lines
	stderrLine string // what main would add to stderr for run's error
}

func (o runOutput) all() string { return o.logs + o.stderrLine }

// runUntilExit runs the sidecar, expecting it to give up by itself within
// d, and returns its output and the exit status main would use.
func runUntilExit(t *testing.T, environ []string, d time.Duration) (runOutput, int) {
	t.Helper()
	c := start(t, environ)
	err, ok := c.exited(d)
	if !ok {
		t.Fatalf("courier still running after %s; logs:\n%s", d, c.logs.String())
	}
	var line strings.Builder
	code := exitCode(err, &line)
	return runOutput{logs: c.logs.String(), stderrLine: line.String()}, code
}

// assertNoSecrets fails if any non-empty secret, or any line of a
// multi-line one, appears in out.
func assertNoSecrets(t *testing.T, out string, secrets []string) {
	t.Helper()
	for _, s := range secrets {
		for line := range strings.SplitSeq(s, "\n") {
			line = strings.TrimSpace(line)
			if len(line) < 8 || strings.HasPrefix(line, "-----") {
				continue // PEM armour and blank lines are not secret
			}
			if strings.Contains(out, line) {
				t.Errorf("output contains the secret %q:\n%s", line, out)
			}
		}
	}
}

func writeFile(t *testing.T, dir, name, content string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func newNKeyUser(t *testing.T) (pub, seed string) {
	t.Helper()
	kp, err := nkeys.CreateUser()
	if err != nil {
		t.Fatal(err)
	}
	pub, err = kp.PublicKey()
	if err != nil {
		t.Fatal(err)
	}
	s, err := kp.Seed()
	if err != nil {
		t.Fatal(err)
	}
	return pub, string(s)
}

func nkeyOption(t *testing.T, seedFile string) nats.Option {
	t.Helper()
	o, err := nats.NkeyOptionFromSeed(seedFile)
	if err != nil {
		t.Fatal(err)
	}
	return o
}

// operator is decentralized (JWT) authentication: an operator key, a system
// account and one JetStream-enabled account, served from memory.
type operator struct {
	kp       nkeys.KeyPair
	resolver *server.MemAccResolver
	system   string
	account  nkeys.KeyPair
}

func newOperator(t *testing.T) *operator {
	t.Helper()
	okp, err := nkeys.CreateOperator()
	if err != nil {
		t.Fatal(err)
	}
	op := &operator{kp: okp, resolver: &server.MemAccResolver{}}
	sys, _ := op.newAccount(t, "SYS", false)
	op.system = sys
	_, op.account = op.newAccount(t, "APP", true)
	return op
}

func (op *operator) newAccount(t *testing.T, name string, jetStream bool) (string, nkeys.KeyPair) {
	t.Helper()
	akp, err := nkeys.CreateAccount()
	if err != nil {
		t.Fatal(err)
	}
	pub, _ := akp.PublicKey()
	ac := jwt.NewAccountClaims(pub)
	ac.Name = name
	if jetStream {
		ac.Limits.JetStreamLimits = jwt.JetStreamLimits{MemoryStorage: -1, DiskStorage: -1, Streams: -1, Consumer: -1}
	}
	tok, err := ac.Encode(op.kp)
	if err != nil {
		t.Fatal(err)
	}
	if err := op.resolver.Store(pub, tok); err != nil {
		t.Fatal(err)
	}
	return pub, akp
}

// configure puts the server in operator mode, trusting op.
func (op *operator) configure(o *server.Options) {
	pub, _ := op.kp.PublicKey()
	o.TrustedKeys = []string{pub}
	o.AccountResolver = op.resolver
	o.SystemAccount = op.system
}

// userCreds returns a credentials file's content for a new user of account,
// and the parts of it that are secret (the JWT and the seed).
func (op *operator) userCreds(t *testing.T, account nkeys.KeyPair) (string, []string) {
	t.Helper()
	ukp, err := nkeys.CreateUser()
	if err != nil {
		t.Fatal(err)
	}
	pub, _ := ukp.PublicKey()
	uc := jwt.NewUserClaims(pub)
	uc.Name = "courier"
	tok, err := uc.Encode(account)
	if err != nil {
		t.Fatal(err)
	}
	seed, _ := ukp.Seed()
	creds, err := jwt.FormatUserConfig(tok, seed)
	if err != nil {
		t.Fatal(err)
	}
	return string(creds), []string{tok, string(seed)}
}

// pki is a CA with a server certificate for 127.0.0.1 and a client
// certificate, as PEM files in a directory.
type pki struct {
	caFile, serverCert, serverKey, clientCert, clientKey string
	clientKeyPEM                                         string
}

func newPKI(t *testing.T, dir, name string) *pki {
	t.Helper()
	caKey := newKey(t)
	caTmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: name},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		t.Fatal(err)
	}
	issue := func(serial int64, cn string, usage x509.ExtKeyUsage, server bool) (certPEM, keyPEM string) {
		key := newKey(t)
		tmpl := &x509.Certificate{
			SerialNumber: big.NewInt(serial),
			Subject:      pkix.Name{CommonName: cn},
			NotBefore:    time.Now().Add(-time.Hour),
			NotAfter:     time.Now().Add(24 * time.Hour),
			KeyUsage:     x509.KeyUsageDigitalSignature,
			ExtKeyUsage:  []x509.ExtKeyUsage{usage},
		}
		if server {
			tmpl.IPAddresses = []net.IP{net.ParseIP("127.0.0.1")}
			tmpl.DNSNames = []string{"localhost"}
		}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
		if err != nil {
			t.Fatal(err)
		}
		return pemBlock("CERTIFICATE", der), pemKey(t, key)
	}
	p := &pki{}
	p.caFile = writeFile(t, dir, name+".pem", pemBlock("CERTIFICATE", caDER))
	sc, sk := issue(2, "nats-server", x509.ExtKeyUsageServerAuth, true)
	p.serverCert = writeFile(t, dir, name+"-server.pem", sc)
	p.serverKey = writeFile(t, dir, name+"-server-key.pem", sk)
	cc, ck := issue(3, "courier", x509.ExtKeyUsageClientAuth, false)
	p.clientCert = writeFile(t, dir, name+"-client.pem", cc)
	p.clientKey = writeFile(t, dir, name+"-client-key.pem", ck)
	p.clientKeyPEM = ck
	return p
}

// serverTLS requires TLS with p's server certificate and, if verify,
// a client certificate signed by p's CA.
func (p *pki) serverTLS(t *testing.T, verify bool) func(*server.Options) {
	t.Helper()
	tc, err := server.GenTLSConfig(&server.TLSConfigOpts{
		CertFile: p.serverCert, KeyFile: p.serverKey, CaFile: p.caFile, Verify: verify,
	})
	if err != nil {
		t.Fatal(err)
	}
	return func(o *server.Options) {
		o.TLSConfig = tc
		o.TLS = true
		o.TLSVerify = verify
		o.TLSTimeout = 2
	}
}

func newKey(t *testing.T) *ecdsa.PrivateKey {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func pemBlock(typ string, der []byte) string {
	return string(pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}))
}

func pemKey(t *testing.T, k *ecdsa.PrivateKey) string {
	t.Helper()
	der, err := x509.MarshalPKCS8PrivateKey(k)
	if err != nil {
		t.Fatal(err)
	}
	return pemBlock("PRIVATE KEY", der)
}

// A credentials or TLS file that cannot be used is final: retrying would
// only log "unreachable" for ever.
func TestAuthMalformedFilesExit1(t *testing.T) {
	h := newHarness(t)
	dir := t.TempDir()
	const junk = "junk-Vq3mZ8rT1wYp6Ls0"
	garbage := writeFile(t, dir, "garbage", junk+"\n")
	pki := newPKI(t, dir, "ca")
	for _, tc := range []struct {
		name string
		env  []string
		want string
	}{
		{"Creds", []string{"NATS_CREDS=" + garbage}, "NATS_CREDS"},
		{"NKey", []string{"NATS_NKEY=" + garbage}, "NATS_NKEY"},
		{"CA", []string{"NATS_CA=" + garbage}, "NATS_CA"},
		{"Cert", []string{"NATS_CERT=" + garbage, "NATS_KEY=" + pki.clientKey}, "NATS_CERT"},
		{"KeyNotMatchingCert", []string{"NATS_CERT=" + pki.clientCert, "NATS_KEY=" + pki.serverKey}, "NATS_KEY"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, code := runUntilExit(t, h.env("http://127.0.0.1:1/", tc.env...), 10*time.Second)
			if code != 1 {
				t.Errorf("exit status %d, want 1\n%s", code, out.all())
			}
			if !strings.Contains(out.stderrLine, tc.want) || strings.Count(out.stderrLine, "\n") != 1 {
				t.Errorf("want one line naming %s, got %q", tc.want, out.stderrLine)
			}
			assertNoSecrets(t, out.all(), []string{junk, pki.clientKeyPEM})
		})
	}
}
