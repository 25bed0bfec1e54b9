package testkube

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"time"
)

// kubeletPKI is the certificate authority between the API server and the
// kubelets: it signs the API server's client certificate, which the
// kubelets of reachable nodes (NodeConfig.Reachable) accept, and those
// kubelets' serving certificates, which the API server checks.
type kubeletPKI struct {
	caFile  string
	ca      *x509.Certificate
	caKey   *ecdsa.PrivateKey
	serials int64
}

// newKubeletPKI makes the authority and writes its certificate to caFile.
func newKubeletPKI(caFile string) (*kubeletPKI, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "gorovod-test-kubelet-ca"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(48 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, err
	}
	ca, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	if err := writePEM(caFile, "CERTIFICATE", der); err != nil {
		return nil, err
	}
	return &kubeletPKI{caFile: caFile, ca: ca, caKey: key, serials: 1}, nil
}

// issue writes a certificate for cn (a client's, or a server's at ips) and
// its key.
func (p *kubeletPKI) issue(certFile, keyFile, cn string, usage x509.ExtKeyUsage, ips ...net.IP) error {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	p.serials++
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(p.serials), Subject: pkix.Name{CommonName: cn},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(48 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{usage}, IPAddresses: ips}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, p.ca, &key.PublicKey, p.caKey)
	if err != nil {
		return err
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return err
	}
	if err := writePEM(certFile, "CERTIFICATE", der); err != nil {
		return err
	}
	return writePEM(keyFile, "EC PRIVATE KEY", kder)
}

func writePEM(file, kind string, der []byte) error {
	return os.WriteFile(file, pem.EncodeToMemory(&pem.Block{Type: kind, Bytes: der}), 0o600)
}
